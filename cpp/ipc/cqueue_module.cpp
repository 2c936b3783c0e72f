// cqueue_module.cpp -- CPython binding of the C core (cqueue.h): the `sf.ipc._cqueue` extension.
//
// Responsibilities, and nothing else:
//  * own the shared mapping: an anonymous memfd (nothing ever appears in /dev/shm; the memory goes away
//    with the last process that maps it), mmap'ed MAP_SHARED; the fd travels to spawned children;
//  * encode Python objects into records and decode records into objects. Small ints and tuples of ints
//    (the index messages the system sends) and bytes skip pickle; anything else is pickled (tagged);
//  * validate arguments with clear Python exceptions, release the GIL around every call into the core,
//    and turn core status codes into queue.Full / queue.Empty / ValueError / OSError.
//
// Payload format (first byte is a tag; see docs/ipc.md):
//   0x01 int       : int64 (8 bytes, native little-endian)
//   0x02 tuple64   : uint8 n, n x int64
//   0x03 tuple32   : uint8 n, n x int32      (all elements fit int32: half the bytes to copy)
//   0x04 bytes     : raw bytes
//   0x05 pickle    : pickle stream (ForkingPickler by default, like multiprocessing.Queue)
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cqueue.h"

namespace {

enum : uint8_t { TAG_INT = 0x01, TAG_TUPLE64 = 0x02, TAG_TUPLE32 = 0x03, TAG_BYTES = 0x04, TAG_PICKLE = 0x05 };

constexpr long long kDefaultMaxSizeBytes = 1 << 20;   // 1 MiB of ring
constexpr size_t kMaxFastTuple = 255;                  // tuple length fits the uint8 count
constexpr size_t kInitialReadBuf = 64 * 1024;          // grows on demand up to the capacity
constexpr size_t kMaxReadBuf = 256 * 1024;             // get_many buffer growth stops here (big messages excepted)
constexpr size_t kStackBuf = 512;                      // put() of a small message needs no malloc

PyObject *g_Full = nullptr;        // queue.Full
PyObject *g_Empty = nullptr;       // queue.Empty
PyObject *g_Corrupt = nullptr;     // _cqueue.CorruptQueueError
PyObject *g_dumps = nullptr;       // obj -> bytes-like
PyObject *g_loads = nullptr;       // bytes-like -> obj

// ---------------------------------------------------------------------------------------------------
// Growable byte buffer that starts in caller-provided (stack or cached) storage.

struct Buf {
    uint8_t *p;
    size_t len;
    size_t cap;
    bool heap;  // p was malloc'ed by this Buf and must be freed

    Buf(uint8_t *storage, size_t storage_cap) : p(storage), len(0), cap(storage_cap), heap(false) {}
    ~Buf() {
        if (heap) PyMem_RawFree(p);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;

    // Ensure room for `extra` more bytes; sets MemoryError on failure.
    bool reserve(size_t extra) {
        if (cap - len >= extra) return true;
        size_t ncap = cap ? cap : 256;
        while (ncap - len < extra) {
            if (ncap > (SIZE_MAX >> 1)) {
                PyErr_NoMemory();
                return false;
            }
            ncap <<= 1;
        }
        uint8_t *np = static_cast<uint8_t *>(heap ? PyMem_RawRealloc(p, ncap) : PyMem_RawMalloc(ncap));
        if (!np) {
            PyErr_NoMemory();
            return false;
        }
        if (!heap && len) std::memcpy(np, p, len);
        p = np;
        cap = ncap;
        heap = true;
        return true;
    }
    // Hand the heap block over to a cache (the caller keeps it for next time).
    uint8_t *release(size_t *out_cap) {
        *out_cap = cap;
        heap = false;
        return p;
    }
};

// ---------------------------------------------------------------------------------------------------
// The queue object.

struct CQueue {
    PyObject_HEAD
    cq_handle h;
    void *map;         // the mmap'ed region, nullptr when not initialised or released
    size_t map_size;
    int fd;            // memfd backing the region (kept open so the queue can be pickled for spawn)
    int closed;        // close() was called in this process
    int inflight;      // calls currently inside the core with the GIL released
    uint8_t *rbuf;     // cached get buffer (grows on demand)
    size_t rbuf_cap;
    int rbuf_busy;     // another thread of this process is using rbuf
    uint8_t *wbuf;     // cached put_many encode buffer
    size_t wbuf_cap;
    int wbuf_busy;
    // Messages already taken off the queue but not yet returned: when one message of a get_many batch
    // cannot be unpickled, its error is raised and the good ones wait here for the next get. (No GC
    // support needed: unpickled messages cannot reference a queue -- queues only pickle for spawn.)
    PyObject *pending;
};

void release_resources(CQueue *self) {
    if (self->map) {
        munmap(self->map, self->map_size);
        self->map = nullptr;
    }
    if (self->fd >= 0) {
        close(self->fd);
        self->fd = -1;
    }
    std::memset(&self->h, 0, sizeof(self->h));
}

// Check the queue can be used; sets ValueError otherwise.
bool check_open(CQueue *self) {
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "Queue is closed");
        return false;
    }
    if (!self->map) {
        PyErr_SetString(PyExc_ValueError, "Queue is not initialised");
        return false;
    }
    return true;
}

// Bracket a call into the core: close() from another thread must not unmap under our feet. Checks
// again that the queue is open: argument conversion or pickling may have run Python code (and let
// another thread call close()) since the method started.
bool enter_core(CQueue *self) {
    if (!check_open(self)) return false;
    ++self->inflight;
    return true;
}
void leave_core(CQueue *self) {
    if (--self->inflight == 0 && self->closed) release_resources(self);
}

// ---------------------------------------------------------------------------------------------------
// Arguments.

// Minimal METH_FASTCALL|METH_KEYWORDS parser: positional then keyword arguments into out[0..n), unset
// ones stay nullptr. Far cheaper than PyArg_ParseTupleAndKeywords on the hot path.
bool parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                const char *const *names, int n, PyObject **out) {
    for (int i = 0; i < n; ++i) out[i] = nullptr;
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
        return false;
    }
    for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
    if (!kwnames) return true;
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; ++k) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int i = 0; i < n; ++i) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                found = i;
                break;
            }
        }
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
            return false;
        }
        if (out[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[found]);
            return false;
        }
        out[found] = args[nargs + k];
    }
    return true;
}

// block/timeout -> absolute deadline, with multiprocessing.Queue's rules: block=False ignores timeout;
// timeout=None blocks forever; a negative timeout is a ValueError.
bool make_deadline(PyObject *block, PyObject *timeout, int64_t *deadline) {
    if (block) {
        const int b = PyObject_IsTrue(block);
        if (b < 0) return false;
        if (!b) {
            *deadline = CQ_NONBLOCK;
            return true;
        }
    }
    if (!timeout || timeout == Py_None) {
        *deadline = CQ_FOREVER;
        return true;
    }
    const double t = PyFloat_AsDouble(timeout);
    if (t == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "'timeout' must be a number or None, not %.100s", Py_TYPE(timeout)->tp_name);
        return false;
    }
    if (std::isnan(t) || t < 0) {
        PyErr_SetString(PyExc_ValueError, "'timeout' must be a non-negative number");
        return false;
    }
    *deadline = t >= 9.0e9 ? CQ_FOREVER : cq_deadline_after(static_cast<int64_t>(t * 1e9));
    return true;
}

// ---------------------------------------------------------------------------------------------------
// Encoding.

inline void put_u32(uint8_t *p, uint32_t v) { std::memcpy(p, &v, 4); }

// Append one record for `obj` to `b`. Fast paths write the payload directly; everything else is pickled.
bool encode(Buf *b, PyObject *obj) {
    const size_t start = b->len;
    if (PyLong_CheckExact(obj)) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (!overflow) {
            if (!b->reserve(4 + 9)) return false;
            uint8_t *p = b->p + start;
            put_u32(p, 9);
            p[4] = TAG_INT;
            std::memcpy(p + 5, &v, 8);
            b->len += 13;
            return true;
        }
        PyErr_Clear();  // too big for int64: pickle keeps it exact
    } else if (PyTuple_CheckExact(obj) && static_cast<size_t>(PyTuple_GET_SIZE(obj)) <= kMaxFastTuple) {
        const Py_ssize_t n = PyTuple_GET_SIZE(obj);
        long long vals[kMaxFastTuple];
        bool fast = true, fits32 = true;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject *item = PyTuple_GET_ITEM(obj, i);
            int overflow = 0;
            // Exact ints only: bool is an int subclass and must come back as a bool.
            if (!PyLong_CheckExact(item)) {
                fast = false;
                break;
            }
            vals[i] = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow) {
                fast = false;
                break;
            }
            fits32 = fits32 && vals[i] >= INT32_MIN && vals[i] <= INT32_MAX;
        }
        if (fast) {
            const size_t width = fits32 ? 4 : 8;
            const size_t plen = 2 + width * static_cast<size_t>(n);
            if (!b->reserve(4 + plen)) return false;
            uint8_t *p = b->p + start;
            put_u32(p, static_cast<uint32_t>(plen));
            p[4] = fits32 ? TAG_TUPLE32 : TAG_TUPLE64;
            p[5] = static_cast<uint8_t>(n);
            uint8_t *q = p + 6;
            if (fits32) {
                for (Py_ssize_t i = 0; i < n; ++i, q += 4) {
                    const int32_t v = static_cast<int32_t>(vals[i]);
                    std::memcpy(q, &v, 4);
                }
            } else {
                std::memcpy(q, vals, 8 * static_cast<size_t>(n));
            }
            b->len += 4 + plen;
            return true;
        }
    } else if (PyBytes_CheckExact(obj)) {
        const size_t n = static_cast<size_t>(PyBytes_GET_SIZE(obj));
        if (n + 1 > CQ_MAX_PAYLOAD) {
            PyErr_Format(PyExc_ValueError, "message of %zu bytes is too large for one queue record", n);
            return false;
        }
        if (!b->reserve(4 + 1 + n)) return false;
        uint8_t *p = b->p + start;
        put_u32(p, static_cast<uint32_t>(n + 1));
        p[4] = TAG_BYTES;
        std::memcpy(p + 5, PyBytes_AS_STRING(obj), n);
        b->len += 5 + n;
        return true;
    }
    // Pickle fallback.
    PyObject *data = PyObject_CallOneArg(g_dumps, obj);
    if (!data) return false;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(data);
        return false;
    }
    bool ok = false;
    const size_t n = static_cast<size_t>(view.len);
    if (n + 1 > CQ_MAX_PAYLOAD) {
        PyErr_Format(PyExc_ValueError, "message of %zu pickled bytes is too large for one queue record", n);
    } else if (b->reserve(4 + 1 + n)) {
        uint8_t *p = b->p + start;
        put_u32(p, static_cast<uint32_t>(n + 1));
        p[4] = TAG_PICKLE;
        std::memcpy(p + 5, view.buf, n);
        b->len += 5 + n;
        ok = true;
    }
    PyBuffer_Release(&view);
    Py_DECREF(data);
    return ok;
}

// A message that can never fit must fail loudly rather than block forever.
bool check_record_fits(const CQueue *self, size_t record_bytes) {
    if (record_bytes > self->h.capacity) {
        PyErr_Format(PyExc_ValueError,
                     "message of %zu bytes (%zu payload + %u framing) is larger than the queue capacity "
                     "max_size_bytes=%llu; create the queue with a larger max_size_bytes",
                     record_bytes, record_bytes - CQ_RECORD_HEADER, CQ_RECORD_HEADER,
                     static_cast<unsigned long long>(self->h.capacity));
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------------
// Decoding.

PyObject *corrupt(const char *what, size_t len) {
    PyErr_Format(g_Corrupt, "corrupt message in queue: %s (payload of %zu bytes)", what, len);
    return nullptr;
}

PyObject *decode(const uint8_t *p, size_t len) {
    if (len < 1) return corrupt("empty payload", len);
    switch (p[0]) {
        case TAG_INT: {
            if (len != 9) return corrupt("bad int length", len);
            long long v;
            std::memcpy(&v, p + 1, 8);
            return PyLong_FromLongLong(v);
        }
        case TAG_TUPLE64:
        case TAG_TUPLE32: {
            if (len < 2) return corrupt("truncated tuple", len);
            const size_t n = p[1], width = p[0] == TAG_TUPLE32 ? 4 : 8;
            if (len != 2 + n * width) return corrupt("bad tuple length", len);
            PyObject *t = PyTuple_New(static_cast<Py_ssize_t>(n));
            if (!t) return nullptr;
            const uint8_t *q = p + 2;
            for (size_t i = 0; i < n; ++i, q += width) {
                long long v;
                if (width == 4) {
                    int32_t v32;
                    std::memcpy(&v32, q, 4);
                    v = v32;
                } else {
                    std::memcpy(&v, q, 8);
                }
                PyObject *item = PyLong_FromLongLong(v);
                if (!item) {
                    Py_DECREF(t);
                    return nullptr;
                }
                PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), item);
            }
            return t;
        }
        case TAG_BYTES:
            return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(p + 1), static_cast<Py_ssize_t>(len - 1));
        case TAG_PICKLE: {
            // Unpickle straight from our buffer (no copy); the view is released before the buffer is reused.
            PyObject *mv = PyMemoryView_FromMemory(reinterpret_cast<char *>(const_cast<uint8_t *>(p + 1)),
                                                   static_cast<Py_ssize_t>(len - 1), PyBUF_READ);
            if (!mv) return nullptr;
            PyObject *obj = PyObject_CallOneArg(g_loads, mv);
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb);  // release() must not run with a loads() error pending
            PyObject *r = PyObject_CallMethod(mv, "release", nullptr);
            if (r) {
                Py_DECREF(r);
                PyErr_Restore(et, ev, etb);
            } else if (obj) {
                // Someone kept an export of the view: refuse rather than let it see the buffer change.
                Py_CLEAR(obj);
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(etb);
            } else {
                PyErr_Clear();
                PyErr_Restore(et, ev, etb);
            }
            Py_DECREF(mv);
            return obj;
        }
        default:
            return corrupt("unknown tag", len);
    }
}

// ---------------------------------------------------------------------------------------------------
// Calls into the core.

PyObject *raise_status(const CQueue *self, int st) {
    switch (st) {
        case CQ_FULL: PyErr_SetNone(g_Full); break;
        case CQ_EMPTY: PyErr_SetNone(g_Empty); break;
        case CQ_E2BIG:
            PyErr_Format(PyExc_ValueError, "batch is larger than the queue capacity (max_size_bytes=%llu, maxsize=%llu)",
                         static_cast<unsigned long long>(self->h.capacity),
                         static_cast<unsigned long long>(self->h.max_messages));
            break;
        case CQ_ECORRUPT: PyErr_SetString(g_Corrupt, "shared queue state failed a bounds check (memory corrupted)"); break;
        case CQ_ESYS: PyErr_SetFromErrno(PyExc_OSError); break;
        default: PyErr_Format(PyExc_SystemError, "queue core returned %d (%s)", st, cq_strstatus(st)); break;
    }
    return nullptr;
}

// A blocking wait is cut into slices of this length, between which Python's signal handlers run: a signal that
// arrives just before the wait starts (after the interpreter's last check, before the futex sleep) interrupts
// nothing, and without slices its KeyboardInterrupt would wait for the next message, forever for a get without one.
constexpr int64_t kSignalSliceNs = 100 * 1000 * 1000;

int64_t slice_of(int64_t deadline) {
    if (deadline == CQ_NONBLOCK) return deadline;
    const int64_t slice = cq_now_ns() + kSignalSliceNs;
    return slice < deadline ? slice : deadline;
}

// Put the records in `b` (n of them), releasing the GIL; retries after signals that raise nothing.
PyObject *do_put(CQueue *self, const Buf &b, size_t n, int64_t deadline) {
    int st;
    if (!enter_core(self)) return nullptr;
    for (;;) {
        const int64_t slice = slice_of(deadline);
        Py_BEGIN_ALLOW_THREADS
        st = cq_put_records(&self->h, b.p, b.len, n, slice, 1);
        Py_END_ALLOW_THREADS
        if (st != CQ_EINTR && !(st == CQ_FULL && slice != deadline)) break;
        if (PyErr_CheckSignals() < 0) {
            leave_core(self);
            return nullptr;
        }
    }
    leave_core(self);
    if (st != CQ_OK) return raise_status(self, st);
    Py_RETURN_NONE;
}

// Serve up to max_msgs messages left over from a batch that had an undecodable message.
PyObject *take_pending(CQueue *self, size_t max_msgs, bool as_list) {
    const Py_ssize_t have = PyList_GET_SIZE(self->pending);
    const Py_ssize_t k = as_list ? static_cast<Py_ssize_t>(std::min<size_t>(max_msgs, static_cast<size_t>(have))) : 1;
    PyObject *res = as_list ? PyList_GetSlice(self->pending, 0, k) : PyList_GET_ITEM(self->pending, 0);
    if (!res) return nullptr;
    if (!as_list) Py_INCREF(res);
    if (PyList_SetSlice(self->pending, 0, k, nullptr) < 0) {
        Py_DECREF(res);
        return nullptr;
    }
    return res;
}

// Get up to `max_msgs` messages; returns a list (as_list) or the single object.
PyObject *do_get(CQueue *self, size_t max_msgs, int64_t deadline, bool as_list) {
    if (!check_open(self)) return nullptr;
    if (self->pending && PyList_GET_SIZE(self->pending) > 0) return take_pending(self, max_msgs, as_list);
    // Use the cached buffer unless another thread of this process is in a get right now.
    const bool own = !self->rbuf_busy;
    uint8_t *buf = nullptr;
    size_t cap = 0;
    if (own) {
        if (!self->rbuf) {
            const size_t want = static_cast<size_t>(std::min<uint64_t>(kInitialReadBuf, self->h.capacity));
            self->rbuf = static_cast<uint8_t *>(PyMem_RawMalloc(want));
            if (!self->rbuf) return PyErr_NoMemory();
            self->rbuf_cap = want;
        }
        buf = self->rbuf;
        cap = self->rbuf_cap;
        self->rbuf_busy = 1;
    } else {
        cap = static_cast<size_t>(std::min<uint64_t>(kInitialReadBuf, self->h.capacity));
        buf = static_cast<uint8_t *>(PyMem_RawMalloc(cap));
        if (!buf) return PyErr_NoMemory();
    }
    PyObject *result = nullptr;
    size_t n = 0, nbytes = 0, needed = 0;
    int st = CQ_OK;
    ++self->inflight;  // checked open above; nothing ran Python code since
    for (;;) {
        const int64_t slice = slice_of(deadline);
        Py_BEGIN_ALLOW_THREADS
        st = cq_get_records(&self->h, buf, cap, max_msgs, slice, 1, &n, &nbytes, &needed);
        Py_END_ALLOW_THREADS
        if (st == CQ_EINTR || (st == CQ_EMPTY && slice != deadline)) {  // a signal, or the end of a slice
            if (PyErr_CheckSignals() < 0) goto done;
            continue;
        }
        if (st == CQ_BUF_TOO_SMALL) {
            // A message bigger than our buffer is waiting (nothing was taken): grow and go again.
            size_t ncap = cap;
            while (ncap < needed) ncap <<= 1;
            uint8_t *nb = static_cast<uint8_t *>(PyMem_RawRealloc(buf, ncap));
            if (!nb) {
                PyErr_NoMemory();
                goto done;
            }
            buf = nb;
            cap = ncap;
            if (own) {
                self->rbuf = buf;
                self->rbuf_cap = cap;
            }
            continue;
        }
        break;
    }
    if (st != CQ_OK) {
        raise_status(self, st);
        goto done;
    }
    {
        // The core validated every length against the ring; re-check against our buffer anyway.
        size_t off = 0, ngood = 0;
        PyObject *etype = nullptr, *evalue = nullptr, *etb = nullptr;  // first decode error
        if (as_list) {
            result = PyList_New(static_cast<Py_ssize_t>(n));
            if (!result) goto done;
        }
        for (size_t i = 0; i < n; ++i) {
            uint32_t len = 0;
            if (nbytes - off >= CQ_RECORD_HEADER) std::memcpy(&len, buf + off, 4);
            if (nbytes - off < CQ_RECORD_HEADER || nbytes - off - CQ_RECORD_HEADER < len) {
                Py_CLEAR(result);  // (a list with unset slots is fine to free)
                Py_XDECREF(etype);
                Py_XDECREF(evalue);
                Py_XDECREF(etb);
                corrupt("record longer than the data read", nbytes - off);
                goto done;
            }
            off += CQ_RECORD_HEADER;
            PyObject *obj = decode(buf + off, len);
            off += len;
            if (!obj) {
                // Typically a pickle that cannot be loaded here. The message is gone from the queue
                // either way; report the first such error, keep decoding the rest.
                if (!etype) PyErr_Fetch(&etype, &evalue, &etb);
                else PyErr_Clear();
                continue;
            }
            if (as_list) PyList_SET_ITEM(result, static_cast<Py_ssize_t>(ngood), obj);
            else result = obj;
            ++ngood;
        }
        if (etype) {
            if (as_list) {
                // The good messages of the batch are returned, in order, by the next get calls.
                if (ngood) {
                    if (!self->pending) self->pending = PyList_New(0);
                    if (self->pending) {
                        const Py_ssize_t end = PyList_GET_SIZE(self->pending);
                        PyObject *good = PyList_GetSlice(result, 0, static_cast<Py_ssize_t>(ngood));
                        if (good) {
                            PyList_SetSlice(self->pending, end, end, good);
                            Py_DECREF(good);
                        }
                    }
                    PyErr_Clear();  // a failure to stash is secondary to the error we report
                }
                Py_CLEAR(result);
            }
            PyErr_Restore(etype, evalue, etb);
        }
    }
done:
    if (own) {
        self->rbuf_busy = 0;
        // get_many grows the buffer to read more per call, but not past kMaxReadBuf unless one message needs it.
        if (as_list && st == CQ_OK && nbytes * 2 > self->rbuf_cap && self->rbuf_cap < kMaxReadBuf &&
            self->rbuf_cap < self->h.capacity) {
            uint8_t *nb = static_cast<uint8_t *>(PyMem_RawRealloc(self->rbuf, self->rbuf_cap * 2));
            if (nb) {
                self->rbuf = nb;
                self->rbuf_cap *= 2;
            }
        }
    } else {
        PyMem_RawFree(buf);
    }
    leave_core(self);
    return result;
}

// ---------------------------------------------------------------------------------------------------
// Methods.

PyObject *CQueue_put(CQueue *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"obj", "block", "timeout"};
    PyObject *a[3];
    if (!parse_args("put", args, nargs, kwnames, names, 3, a)) return nullptr;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "put() missing required argument 'obj'");
        return nullptr;
    }
    if (!check_open(self)) return nullptr;
    int64_t deadline;
    if (!make_deadline(a[1], a[2], &deadline)) return nullptr;
    uint8_t stack[kStackBuf];
    Buf b(stack, sizeof(stack));
    if (!encode(&b, a[0]) || !check_record_fits(self, b.len)) return nullptr;
    return do_put(self, b, 1, deadline);
}

PyObject *CQueue_put_nowait(CQueue *self, PyObject *obj) {
    if (!check_open(self)) return nullptr;
    uint8_t stack[kStackBuf];
    Buf b(stack, sizeof(stack));
    if (!encode(&b, obj) || !check_record_fits(self, b.len)) return nullptr;
    return do_put(self, b, 1, CQ_NONBLOCK);
}

PyObject *CQueue_put_many(CQueue *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"objs", "block", "timeout"};
    PyObject *a[3];
    if (!parse_args("put_many", args, nargs, kwnames, names, 3, a)) return nullptr;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "put_many() missing required argument 'objs'");
        return nullptr;
    }
    if (!check_open(self)) return nullptr;
    int64_t deadline;
    if (!make_deadline(a[1], a[2], &deadline)) return nullptr;
    PyObject *seq = PySequence_Fast(a[0], "put_many() expects a list, tuple or other iterable of messages");
    if (!seq) return nullptr;
    Py_ssize_t n = 0;
    PyObject *result = nullptr;
    const bool own = !self->wbuf_busy;
    uint8_t stack[kStackBuf];
    Buf b(own && self->wbuf ? self->wbuf : stack, own && self->wbuf ? self->wbuf_cap : sizeof(stack));
    if (own) {
        b.heap = self->wbuf != nullptr;  // the cached block may be grown (realloc'ed) by the Buf
        self->wbuf = nullptr;
        self->wbuf_busy = 1;
    }
    // Re-read size and item every time: pickling an item runs Python code, which may change a list
    // (PySequence_Fast returns lists as they are, not a copy).
    for (; n < PySequence_Fast_GET_SIZE(seq); ++n) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, n);
        Py_INCREF(item);
        const size_t before = b.len;
        const bool ok = encode(&b, item) && check_record_fits(self, b.len - before);
        Py_DECREF(item);
        if (!ok) goto done;
    }
    if (b.len > self->h.capacity || (self->h.max_messages && static_cast<uint64_t>(n) > self->h.max_messages)) {
        PyErr_Format(PyExc_ValueError,
                     "put_many() batch of %zd messages (%zu bytes with framing) can never fit the queue "
                     "(max_size_bytes=%llu, maxsize=%llu); put it in smaller batches",
                     n, b.len, static_cast<unsigned long long>(self->h.capacity),
                     static_cast<unsigned long long>(self->h.max_messages));
        goto done;
    }
    result = n ? do_put(self, b, static_cast<size_t>(n), deadline) : (Py_INCREF(Py_None), Py_None);
done:
    if (own) {
        if (b.heap) self->wbuf = b.release(&self->wbuf_cap);  // keep the grown block for next time
        self->wbuf_busy = 0;
    }
    Py_DECREF(seq);
    return result;
}

PyObject *CQueue_get(CQueue *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"block", "timeout"};
    PyObject *a[2];
    if (!parse_args("get", args, nargs, kwnames, names, 2, a)) return nullptr;
    if (!check_open(self)) return nullptr;
    int64_t deadline;
    if (!make_deadline(a[0], a[1], &deadline)) return nullptr;
    return do_get(self, 1, deadline, false);
}

PyObject *CQueue_get_nowait(CQueue *self, PyObject *) {
    if (!check_open(self)) return nullptr;
    return do_get(self, 1, CQ_NONBLOCK, false);
}

PyObject *CQueue_get_many(CQueue *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"block", "timeout", "max_messages_to_get"};
    PyObject *a[3];
    if (!parse_args("get_many", args, nargs, kwnames, names, 3, a)) return nullptr;
    if (!check_open(self)) return nullptr;
    int64_t deadline;
    if (!make_deadline(a[0], a[1], &deadline)) return nullptr;
    size_t max_msgs = SIZE_MAX;
    if (a[2] && a[2] != Py_None) {
        const long long m = PyLong_AsLongLong(a[2]);
        if (m == -1 && PyErr_Occurred()) return nullptr;
        if (m < 1) {
            PyErr_Format(PyExc_ValueError, "max_messages_to_get must be >= 1, got %lld", m);
            return nullptr;
        }
        max_msgs = static_cast<size_t>(m);
    }
    return do_get(self, max_msgs, deadline, true);
}

// Counters with the GIL released (the lock is brief, but never wait for it while holding the GIL).
// check_waiters: also find sleepers that died (one trylock per registered sleeper) so that the waiter
// counts are exact -- for stats(); qsize()/empty()/full() only need the message count.
bool read_stats(CQueue *self, cq_stats *st, int check_waiters = 0) {
    if (!check_open(self)) return false;
    int r;
    if (!enter_core(self)) return false;
    Py_BEGIN_ALLOW_THREADS
    r = cq_get_stats(&self->h, st, check_waiters);
    Py_END_ALLOW_THREADS
    leave_core(self);
    if (r != CQ_OK) {
        raise_status(self, r);
        return false;
    }
    return true;
}

PyObject *CQueue_qsize(CQueue *self, PyObject *) {
    cq_stats st;
    if (!read_stats(self, &st)) return nullptr;
    return PyLong_FromUnsignedLongLong(st.count);
}

PyObject *CQueue_empty(CQueue *self, PyObject *) {
    cq_stats st;
    if (!read_stats(self, &st)) return nullptr;
    return PyBool_FromLong(st.count == 0);
}

PyObject *CQueue_full(CQueue *self, PyObject *) {
    cq_stats st;
    if (!read_stats(self, &st)) return nullptr;
    // Full: the message limit is reached, or not even the smallest message (an empty bytes: 5 bytes) fits.
    const bool full = (st.max_messages && st.count >= st.max_messages) || st.capacity - st.used_bytes < CQ_RECORD_HEADER + 1;
    return PyBool_FromLong(full);
}

PyObject *CQueue_stats(CQueue *self, PyObject *) {
    cq_stats st;
    if (!read_stats(self, &st, 1)) return nullptr;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:I,s:I}", "count", st.count, "used_bytes", st.used_bytes,
                         "capacity", st.capacity, "max_messages", st.max_messages, "recoveries", st.recoveries,
                         "waiters_reaped", st.waiters_reaped, "consumers_waiting", st.consumers_waiting,
                         "producers_waiting", st.producers_waiting, "consumers_unwoken", st.consumers_unwoken,
                         "producers_unwoken", st.producers_unwoken);
}

PyObject *CQueue_close(CQueue *self, PyObject *) {
    if (!self->closed) {
        self->closed = 1;
        if (self->inflight == 0) release_resources(self);  // else the last call in flight releases it
    }
    Py_RETURN_NONE;
}

PyObject *CQueue_attach_fd(CQueue *self, PyObject *arg) {
    const long fd_l = PyLong_AsLong(arg);
    if (fd_l == -1 && PyErr_Occurred()) return nullptr;
    if (fd_l < 0 || fd_l > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "invalid file descriptor %ld", fd_l);
        return nullptr;
    }
    const int fd = static_cast<int>(fd_l);
    if (self->map || self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "queue object is already initialised");
        return nullptr;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (sb.st_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "file descriptor does not hold a queue (size 0)");
        return nullptr;
    }
    const size_t size = static_cast<size_t>(sb.st_size);
    void *mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    const int r = cq_attach(&self->h, mem, size);
    if (r != CQ_OK) {
        munmap(mem, size);
        PyErr_Format(PyExc_ValueError, "file descriptor %d does not hold a queue: %s", fd, cq_strstatus(r));
        return nullptr;
    }
    self->map = mem;
    self->map_size = size;
    self->fd = fd;  // ours from now on
    Py_RETURN_NONE;
}

int CQueue_init(CQueue *self, PyObject *args, PyObject *kwds) {
    static const char *kwlist[] = {"maxsize", "max_size_bytes", nullptr};
    long long maxsize = 0, max_size_bytes = kDefaultMaxSizeBytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|LL:Queue", const_cast<char **>(kwlist), &maxsize, &max_size_bytes))
        return -1;
    if (self->map || self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "queue object is already initialised");
        return -1;
    }
    if (max_size_bytes < static_cast<long long>(CQ_MIN_CAPACITY) || max_size_bytes > static_cast<long long>(CQ_MAX_CAPACITY)) {
        PyErr_Format(PyExc_ValueError, "max_size_bytes must be between %u and %llu, got %lld", CQ_MIN_CAPACITY,
                     static_cast<unsigned long long>(CQ_MAX_CAPACITY), max_size_bytes);
        return -1;
    }
    // Like multiprocessing.Queue: maxsize <= 0 means no limit on the number of messages.
    const uint64_t max_messages = maxsize > 0 ? static_cast<uint64_t>(maxsize) : 0;
    const size_t size = cq_region_size(static_cast<uint64_t>(max_size_bytes));
    // memfd: anonymous shared memory with a file descriptor (so spawned children can map it) and no name
    // in any filesystem -- nothing can be left behind in /dev/shm, whatever way the processes die.
    const int fd = memfd_create("sf-ipc-queue", MFD_CLOEXEC);
    if (fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        close(fd);
        return -1;
    }
    void *mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        close(fd);
        return -1;
    }
    const int r = cq_init(&self->h, mem, size, static_cast<uint64_t>(max_size_bytes), max_messages);
    if (r != CQ_OK) {
        munmap(mem, size);
        close(fd);
        if (r == CQ_ESYS) PyErr_SetFromErrno(PyExc_OSError);
        else PyErr_Format(PyExc_ValueError, "cannot initialise queue: %s", cq_strstatus(r));
        return -1;
    }
    self->map = mem;
    self->map_size = size;
    self->fd = fd;
    return 0;
}

PyObject *CQueue_new(PyTypeObject *type, PyObject *, PyObject *) {
    CQueue *self = reinterpret_cast<CQueue *>(type->tp_alloc(type, 0));
    if (!self) return nullptr;
    self->fd = -1;  // everything else is zeroed by tp_alloc
    return reinterpret_cast<PyObject *>(self);
}

void CQueue_dealloc(CQueue *self) {
    PyTypeObject *tp = Py_TYPE(self);
    release_resources(self);
    PyMem_RawFree(self->rbuf);
    PyMem_RawFree(self->wbuf);
    Py_XDECREF(self->pending);
    tp->tp_free(reinterpret_cast<PyObject *>(self));
    Py_DECREF(tp);  // heap type: every instance holds a reference to it
}

PyObject *CQueue_get_fd(CQueue *self, void *) {
    if (!check_open(self)) return nullptr;
    return PyLong_FromLong(self->fd);
}

PyObject *CQueue_get_maxsize(CQueue *self, void *) {
    return PyLong_FromUnsignedLongLong(self->map ? self->h.max_messages : 0);
}

PyObject *CQueue_get_max_size_bytes(CQueue *self, void *) {
    return PyLong_FromUnsignedLongLong(self->map ? self->h.capacity : 0);
}

PyObject *CQueue_get_closed(CQueue *self, void *) { return PyBool_FromLong(self->closed); }

PyMethodDef CQueue_methods[] = {
    {"put", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(CQueue_put)), METH_FASTCALL | METH_KEYWORDS,
     "put(obj, block=True, timeout=None)\n--\n\n"
     "Put obj into the queue. If block is true, wait up to timeout seconds (None: forever) for room;\n"
     "raise queue.Full if there is none. ValueError if the message can never fit the capacity."},
    {"put_nowait", reinterpret_cast<PyCFunction>(CQueue_put_nowait), METH_O,
     "put_nowait(obj)\n--\n\nEquivalent to put(obj, block=False)."},
    {"put_many", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(CQueue_put_many)),
     METH_FASTCALL | METH_KEYWORDS,
     "put_many(objs, block=True, timeout=None)\n--\n\n"
     "Put every object of the sequence objs, all or nothing: waits until the whole batch fits, then\n"
     "publishes it with one lock acquisition. queue.Full on timeout; ValueError if the batch can never fit."},
    {"get", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(CQueue_get)), METH_FASTCALL | METH_KEYWORDS,
     "get(block=True, timeout=None)\n--\n\n"
     "Remove and return the oldest message. If block is true, wait up to timeout seconds (None: forever);\n"
     "raise queue.Empty if nothing arrived."},
    {"get_nowait", reinterpret_cast<PyCFunction>(CQueue_get_nowait), METH_NOARGS,
     "get_nowait()\n--\n\nEquivalent to get(block=False)."},
    {"get_many", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(CQueue_get_many)),
     METH_FASTCALL | METH_KEYWORDS,
     "get_many(block=True, timeout=None, max_messages_to_get=None)\n--\n\n"
     "Wait like get() for at least one message, then remove and return (as a list, oldest first) every\n"
     "message available up to max_messages_to_get (None: no limit; at most ~256 KB per call)."},
    {"qsize", reinterpret_cast<PyCFunction>(CQueue_qsize), METH_NOARGS,
     "qsize()\n--\n\nNumber of messages in the queue (a snapshot)."},
    {"empty", reinterpret_cast<PyCFunction>(CQueue_empty), METH_NOARGS,
     "empty()\n--\n\nTrue if the queue holds no message (a snapshot)."},
    {"full", reinterpret_cast<PyCFunction>(CQueue_full), METH_NOARGS,
     "full()\n--\n\nTrue if maxsize messages are queued or not even the smallest message fits (a snapshot)."},
    {"stats", reinterpret_cast<PyCFunction>(CQueue_stats), METH_NOARGS,
     "stats()\n--\n\nDict of counters: count, used_bytes, capacity, max_messages, recoveries (dead lock\n"
     "holders recovered), waiters_reaped (registrations of dead sleepers removed), consumers_waiting and\n"
     "producers_waiting (processes/threads asleep in get/put right now; exact: dead ones are not counted),\n"
     "consumers_unwoken and producers_unwoken (of those, not woken yet: a hint that may over-estimate)."},
    {"close", reinterpret_cast<PyCFunction>(CQueue_close), METH_NOARGS,
     "close()\n--\n\nRelease this process's mapping of the queue (other processes are unaffected).\n"
     "Later calls on this object raise ValueError."},
    {"_attach_fd", reinterpret_cast<PyCFunction>(CQueue_attach_fd), METH_O,
     "_attach_fd(fd)\n--\n\nInternal: map the queue held by memfd fd (taking ownership of fd); used when\n"
     "unpickling in a spawned child."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef CQueue_getset[] = {
    {"_fd", reinterpret_cast<getter>(CQueue_get_fd), nullptr, "memfd holding the shared region (internal).", nullptr},
    {"maxsize", reinterpret_cast<getter>(CQueue_get_maxsize), nullptr, "Message-count limit (0 = none).", nullptr},
    {"max_size_bytes", reinterpret_cast<getter>(CQueue_get_max_size_bytes), nullptr,
     "Ring capacity in bytes (messages take their payload + 4 bytes).", nullptr},
    {"closed", reinterpret_cast<getter>(CQueue_get_closed), nullptr, "True after close() in this process.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot CQueue_slots[] = {
    {Py_tp_doc, const_cast<char *>("CQueue(maxsize=0, max_size_bytes=1048576)\n--\n\n"
                                   "Multi-producer multi-consumer queue in shared memory. Base of sf.ipc.Queue.")},
    {Py_tp_new, reinterpret_cast<void *>(CQueue_new)},
    {Py_tp_init, reinterpret_cast<void *>(CQueue_init)},
    {Py_tp_dealloc, reinterpret_cast<void *>(CQueue_dealloc)},
    {Py_tp_methods, CQueue_methods},
    {Py_tp_getset, CQueue_getset},
    {0, nullptr},
};

PyType_Spec CQueue_spec = {
    "sf.ipc._cqueue.CQueue", sizeof(CQueue), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, CQueue_slots,
};

PyObject *set_serializers(PyObject *, PyObject *args) {
    PyObject *dumps, *loads;
    if (!PyArg_ParseTuple(args, "OO:_set_serializers", &dumps, &loads)) return nullptr;
    if (!PyCallable_Check(dumps) || !PyCallable_Check(loads)) {
        PyErr_SetString(PyExc_TypeError, "dumps and loads must be callable");
        return nullptr;
    }
    Py_INCREF(dumps);
    Py_INCREF(loads);
    Py_XSETREF(g_dumps, dumps);
    Py_XSETREF(g_loads, loads);
    Py_RETURN_NONE;
}

PyMethodDef module_methods[] = {
    {"_set_serializers", set_serializers, METH_VARARGS,
     "_set_serializers(dumps, loads)\n--\n\nSet the functions used for messages without a fast path\n"
     "(dumps must return a bytes-like object)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_cqueue",
    "Shared-memory circular-buffer queue (C++ core with robust mutexes and futex waits); use sf.ipc.Queue.",
    -1, module_methods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__cqueue(void) {
    PyObject *type = PyType_FromSpec(&CQueue_spec);
    if (!type) return nullptr;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) {
        Py_DECREF(type);
        return nullptr;
    }
    PyObject *queue_mod = PyImport_ImportModule("queue");
    PyObject *pickle_mod = PyImport_ImportModule("pickle");
    if (!queue_mod || !pickle_mod) goto fail;
    g_Full = PyObject_GetAttrString(queue_mod, "Full");
    g_Empty = PyObject_GetAttrString(queue_mod, "Empty");
    g_dumps = PyObject_GetAttrString(pickle_mod, "dumps");
    g_loads = PyObject_GetAttrString(pickle_mod, "loads");
    g_Corrupt = PyErr_NewExceptionWithDoc("sf.ipc._cqueue.CorruptQueueError",
                                          "The queue's shared memory failed a bounds check.", PyExc_RuntimeError, nullptr);
    if (!g_Full || !g_Empty || !g_dumps || !g_loads || !g_Corrupt) goto fail;
    Py_INCREF(g_Corrupt);
    if (PyModule_AddObject(m, "CorruptQueueError", g_Corrupt) < 0) goto fail;
    if (PyModule_AddObject(m, "CQueue", type) < 0) goto fail;
    type = nullptr;  // the module owns it now
    if (PyModule_AddIntConstant(m, "DEFAULT_MAX_SIZE_BYTES", kDefaultMaxSizeBytes) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "RECORD_HEADER_BYTES", CQ_RECORD_HEADER) < 0) goto fail;
    Py_DECREF(queue_mod);
    Py_DECREF(pickle_mod);
    return m;
fail:
    Py_XDECREF(type);
    Py_XDECREF(queue_mod);
    Py_XDECREF(pickle_mod);
    Py_DECREF(m);
    return nullptr;
}
