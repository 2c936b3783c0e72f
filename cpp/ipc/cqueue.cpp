// cqueue.cpp -- implementation of the shared-memory circular-buffer queue declared in cqueue.h.
//
// Protocol summary (the full argument is in docs/ipc.md):
//  * One robust, process-shared pthread mutex guards the ring and the committed state. It is only ever
//    held for a bounded memcpy, never while sleeping.
//  * The state {head, used, count} is double-buffered: the lock holder writes the *other* copy and then
//    flips `state_idx` with one release store. Whatever instruction a holder dies at, the next locker
//    (told by EOWNERDEAD) finds `state[state_idx]` consistent; bytes copied past the tail by a dying
//    producer lie in free space and are simply overwritten later.
//  * Sleeping uses raw futexes on two shared sequence words (not pthread condvars: glibc's process-shared
//    condvars keep per-waiter bookkeeping that a waiter killed at the wrong moment leaves inconsistent,
//    which can block later signal/broadcast calls). Sleepers register in a counter under the lock so that
//    wakers only make the futex_wake syscall when somebody sleeps, and wakers take the sleepers the
//    kernel reports woken off that counter at once, so no second syscall is spent on the same sleeper.
#include "cqueue.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr uint64_t kMagic = 0x4555514350494653ull;  // "SFIPCQUE" read as little-endian bytes
constexpr uint32_t kVersion = 1;
// A sleeper re-examines the queue at least this often even if nobody wakes it. This is a safety net for
// wakeups lost to a process killed between its unlock and its futex_wake (or a woken consumer killed
// before it consumed); it costs ~4 syscalls per second per sleeper, i.e. no measurable CPU.
constexpr int64_t kRecheckNs = 250'000'000;
// Lock acquisition is allowed to run this much past a caller's deadline: the mutex is held only for a
// memcpy, so waiting for it must not turn into a spurious Empty/Full (timeout=0 would otherwise fail
// under mere contention), yet a holder that is stopped (SIGSTOP) must not block a timed call forever.
constexpr int64_t kLockGraceNs = 1'000'000'000;
constexpr int64_t kNsPerSec = 1'000'000'000;

// Internal results of the lock / wait helpers.
constexpr int kLockTimeout = 100;  // lock not acquired (lock NOT held)
constexpr int kWaitTimeout = 101;  // deadline passed (lock held)

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words must be plain 32-bit words");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

}  // namespace

// The committed queue state (lives in the shared header, hence not in the anonymous namespace).
struct cq_committed_state {
    uint64_t head;   // ring offset of the first record, < capacity
    uint64_t used;   // bytes of records in the ring, <= capacity
    uint64_t count;  // number of records
};
using State = cq_committed_state;

// The shared header. Everything below `mutex` except the futex words is protected by the mutex.
struct alignas(64) cq_header {
    std::atomic<uint64_t> magic;  // written last by cq_init
    uint32_t version;
    uint32_t header_size;
    uint64_t capacity;
    uint64_t max_messages;
    uint64_t region_size;

    alignas(64) pthread_mutex_t mutex;
    std::atomic<uint32_t> state_idx;  // which of state[0..1] is committed
    // Registered sleepers on not_empty_seq / not_full_seq. A sleeper adds itself under the lock; it is
    // removed exactly once: by the waker that the kernel says woke it, or by itself when its wait ends
    // any other way. A sleeper killed in its wait stays counted: an upper bound, never an under-count.
    std::atomic<uint32_t> consumers_waiting;
    std::atomic<uint32_t> producers_waiting;
    uint32_t pad_;
    State state[2];
    uint64_t recoveries;  // EOWNERDEAD recoveries, for diagnostics and tests

    // The futex words get their own cache lines: sleepers read them, wakers bump them.
    alignas(64) std::atomic<uint32_t> not_empty_seq;
    alignas(64) std::atomic<uint32_t> not_full_seq;
};

namespace {

constexpr size_t kHeaderSize = (sizeof(cq_header) + 63) & ~size_t(63);

inline State load_state(const cq_header *hd) {
    return hd->state[hd->state_idx.load(std::memory_order_relaxed) & 1u];
}

// Publish `s`: write the spare copy, then flip the index with a release store so that the ring bytes and
// the spare copy are in memory (program order is all that matters for a dying process) before it.
inline void commit(cq_header *hd, const State &s) {
    const uint32_t cur = hd->state_idx.load(std::memory_order_relaxed) & 1u;
    hd->state[cur ^ 1u] = s;
    hd->state_idx.store(cur ^ 1u, std::memory_order_release);
}

inline bool state_valid(const cq_handle *h, const State &s) {
    return s.head < h->capacity && s.used <= h->capacity && s.count <= s.used / CQ_RECORD_HEADER &&
           (s.count == 0) == (s.used == 0) && (h->max_messages == 0 || s.count <= h->max_messages);
}

// Copy into / out of the ring at `pos` (< capacity), wrapping around the end. n <= capacity.
inline void ring_write(const cq_handle *h, uint64_t pos, const uint8_t *src, size_t n) {
    const size_t first = static_cast<size_t>(std::min<uint64_t>(n, h->capacity - pos));
    std::memcpy(h->ring + pos, src, first);
    if (n > first) std::memcpy(h->ring, src + first, n - first);
}

inline void ring_read(const cq_handle *h, uint64_t pos, uint8_t *dst, size_t n) {
    const size_t first = static_cast<size_t>(std::min<uint64_t>(n, h->capacity - pos));
    std::memcpy(dst, h->ring + pos, first);
    if (n > first) std::memcpy(dst + first, h->ring, n - first);
}

inline uint64_t ring_advance(const cq_handle *h, uint64_t pos, uint64_t n) {
    pos += n;  // pos < capacity and n <= capacity: no overflow for capacities <= 2^40
    return pos >= h->capacity ? pos - h->capacity : pos;
}

inline timespec to_timespec(int64_t ns) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(ns / kNsPerSec);
    ts.tv_nsec = static_cast<long>(ns % kNsPerSec);
    return ts;
}

inline int64_t add_sat(int64_t a, int64_t b) {  // a, b >= 0
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

inline uint32_t *futex_addr(std::atomic<uint32_t> *a) { return reinterpret_cast<uint32_t *>(a); }

// Sleep while *word == expected, until the absolute CLOCK_MONOTONIC deadline (CQ_FOREVER: no limit).
// Returns 0 or an errno (EAGAIN: value already changed, ETIMEDOUT, EINTR).
int futex_wait_until(std::atomic<uint32_t> *word, uint32_t expected, int64_t deadline_ns) {
    timespec ts;
    const timespec *pts = nullptr;
    if (deadline_ns != CQ_FOREVER) {
        ts = to_timespec(deadline_ns);
        pts = &ts;
    }
    // FUTEX_WAIT_BITSET takes an absolute timeout on CLOCK_MONOTONIC (no FUTEX_CLOCK_REALTIME flag);
    // no FUTEX_PRIVATE_FLAG because the word is shared between processes.
    const long rc = syscall(SYS_futex, futex_addr(word), FUTEX_WAIT_BITSET, expected, pts, nullptr,
                            FUTEX_BITSET_MATCH_ANY);
    return rc == 0 ? 0 : errno;
}

// Subtract without going below zero (the counters are hints that must never wrap around).
void sub_floor0(std::atomic<uint32_t> *a, uint32_t n) {
    uint32_t cur = a->load(std::memory_order_relaxed);
    while (cur != 0 && !a->compare_exchange_weak(cur, cur > n ? cur - n : 0, std::memory_order_relaxed)) {
    }
}

// Wake up to n sleepers on `word` and take the ones the kernel actually woke off `waiters` -- right away,
// so that puts/gets made before they get to run do not see them as sleeping and wake again (a futex
// wake that has to kick another CPU is the most expensive thing a put does).
void futex_wake(std::atomic<uint32_t> *word, std::atomic<uint32_t> *waiters, uint64_t n) {
    const int count = n > static_cast<uint64_t>(INT_MAX) ? INT_MAX : static_cast<int>(n);
    const long woken = syscall(SYS_futex, futex_addr(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
    if (woken > 0) sub_floor0(waiters, static_cast<uint32_t>(woken));
}

// Acquire the queue mutex. A dead previous owner (EOWNERDEAD) is recovered here: the committed state is
// consistent by construction, so all that is left is to mark the mutex consistent and remember to wake
// every sleeper (the dead owner may have owed them a wakeup). Returns CQ_OK (lock held), kLockTimeout or
// CQ_ESYS (lock not held).
int lock_queue(const cq_handle *h, int64_t deadline_ns, bool *recovered) {
    pthread_mutex_t *m = &h->hdr->mutex;
    int r = pthread_mutex_trylock(m);  // fast path: no clock read when uncontended
    if (r == EBUSY) {
        if (deadline_ns == CQ_FOREVER) {
            r = pthread_mutex_lock(m);
        } else {
            const int64_t until = std::max(deadline_ns, add_sat(cq_now_ns(), kLockGraceNs));
            const timespec ts = to_timespec(until);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
            r = pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
#else
            timespec rt;
            clock_gettime(CLOCK_REALTIME, &rt);
            const int64_t rel = until - cq_now_ns();
            const timespec abs_rt = to_timespec(add_sat(rt.tv_sec * kNsPerSec + rt.tv_nsec, std::max<int64_t>(rel, 0)));
            r = pthread_mutex_timedlock(m, &abs_rt);
#endif
        }
    }
    if (r == 0) return CQ_OK;
    if (r == EOWNERDEAD) {
        h->hdr->recoveries++;
        pthread_mutex_consistent(m);
        *recovered = true;
        return CQ_OK;
    }
    if (r == ETIMEDOUT) return kLockTimeout;
    errno = r;  // ENOTRECOVERABLE (only if someone unlocked without recovering) or EINVAL
    return CQ_ESYS;
}

// Wake every sleeper of both kinds. Bumping the words first makes a sleeper that registered but has not
// reached futex_wait yet return at once (EAGAIN); the bumps are atomic, so this is safe with or without
// the lock.
void wake_everyone(cq_header *hd) {
    hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
    hd->not_full_seq.fetch_add(1, std::memory_order_relaxed);
    futex_wake(&hd->not_empty_seq, &hd->consumers_waiting, INT_MAX);
    futex_wake(&hd->not_full_seq, &hd->producers_waiting, INT_MAX);
}

// Release the mutex. After a recovery, wake every sleeper so nobody waits for a wakeup the dead owner
// never sent.
void unlock_queue(const cq_handle *h, bool recovered) {
    pthread_mutex_unlock(&h->hdr->mutex);
    if (recovered) wake_everyone(h->hdr);
}

// Called with the lock held: register as a sleeper on `seq`, unlock, sleep until woken, the deadline or
// the recheck interval, relock. Returns CQ_OK (lock held: re-examine the state), kWaitTimeout (lock
// held: the deadline has passed), CQ_EINTR (lock held), or kLockTimeout / CQ_ESYS (lock NOT held).
int wait_locked(const cq_handle *h, std::atomic<uint32_t> *seq, std::atomic<uint32_t> *waiters,
                int64_t deadline_ns, int interruptible, bool *recovered) {
    const int64_t now = cq_now_ns();
    if (deadline_ns <= now) return kWaitTimeout;
    // Read the sequence under the lock: any waker that changes the state after we unlock must also bump
    // it, so futex_wait below either sees the new value (EAGAIN) or is woken.
    const uint32_t expected = seq->load(std::memory_order_relaxed);
    waiters->fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_unlock(&h->hdr->mutex);
    const int err = futex_wait_until(seq, expected, std::min(deadline_ns, add_sat(now, kRecheckNs)));
    // Woken (err == 0): the waker already took us off the count. Otherwise (timeout, value changed
    // before we slept, signal) nobody did: do it ourselves.
    if (err != 0) sub_floor0(waiters, 1);
    const int lr = lock_queue(h, deadline_ns, recovered);
    if (lr != CQ_OK) return lr;
    if (err == EINTR && interruptible) return CQ_EINTR;
    return CQ_OK;
}

// Check a buffer of back-to-back records: exactly n records, exactly nbytes bytes.
bool records_well_formed(const uint8_t *p, size_t nbytes, size_t n) {
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
        if (nbytes - off < CQ_RECORD_HEADER) return false;
        uint32_t len;
        std::memcpy(&len, p + off, sizeof(len));
        if (nbytes - off - CQ_RECORD_HEADER < len) return false;
        off += CQ_RECORD_HEADER + len;
    }
    return off == nbytes;
}

// put: the bytes written are `a` followed by `b` (lets cq_put write a header and a payload without
// assembling them first). The batch is all-or-nothing.
int put_impl(const cq_handle *h, const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len, size_t n,
             int64_t deadline_ns, int interruptible) {
    const uint64_t nbytes = static_cast<uint64_t>(a_len) + b_len;
    if (nbytes > h->capacity || (h->max_messages != 0 && n > h->max_messages)) return CQ_E2BIG;
    cq_header *hd = h->hdr;
    bool recovered = false;
    int r = lock_queue(h, deadline_ns, &recovered);
    if (r == kLockTimeout) return CQ_FULL;
    if (r != CQ_OK) return r;

    int status = CQ_OK;
    uint64_t wake_consumers = 0;
    for (;;) {
        const State s = load_state(hd);
        if (!state_valid(h, s)) {
            status = CQ_ECORRUPT;
            break;
        }
        if (h->capacity - s.used >= nbytes && (h->max_messages == 0 || h->max_messages - s.count >= n)) {
            const uint64_t tail = ring_advance(h, s.head, s.used);
            ring_write(h, tail, a, a_len);
            if (b_len) ring_write(h, ring_advance(h, tail, a_len), b, b_len);
            commit(hd, State{s.head, s.used + nbytes, s.count + n});
            // Only pay for a wakeup when someone sleeps; wake as many as there are new messages.
            const uint32_t sleeping = hd->consumers_waiting.load(std::memory_order_relaxed);
            if (sleeping != 0) {
                wake_consumers = std::min<uint64_t>(sleeping, n);
                hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
            }
            break;
        }
        r = wait_locked(h, &hd->not_full_seq, &hd->producers_waiting, deadline_ns, interruptible, &recovered);
        if (r == CQ_OK) continue;
        if (r == kWaitTimeout) {
            status = CQ_FULL;
            break;
        }
        if (r == CQ_EINTR) {
            status = CQ_EINTR;
            break;
        }
        if (recovered) wake_everyone(hd);  // lock not held; the sequence bumps are atomic anyway
        return r == kLockTimeout ? CQ_FULL : r;
    }
    unlock_queue(h, recovered);
    if (wake_consumers && !recovered) futex_wake(&hd->not_empty_seq, &hd->consumers_waiting, wake_consumers);
    return status;
}

}  // namespace

extern "C" {

int64_t cq_now_ns(void) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * kNsPerSec + ts.tv_nsec;
}

int64_t cq_deadline_after(int64_t timeout_ns) {
    if (timeout_ns < 0) return CQ_FOREVER;
    return add_sat(cq_now_ns(), timeout_ns);
}

size_t cq_region_size(uint64_t capacity) {
    if (capacity < CQ_MIN_CAPACITY || capacity > CQ_MAX_CAPACITY) return 0;
    if (capacity > SIZE_MAX - kHeaderSize) return 0;
    return kHeaderSize + static_cast<size_t>(capacity);
}

int cq_init(cq_handle *h, void *region, size_t region_size, uint64_t capacity, uint64_t max_messages) {
    if (!h || !region) return CQ_EINVAL;
    const size_t need = cq_region_size(capacity);
    if (need == 0 || region_size < need) return CQ_EINVAL;
    if (reinterpret_cast<uintptr_t>(region) % alignof(cq_header) != 0) return CQ_EINVAL;

    std::memset(region, 0, kHeaderSize);
    cq_header *hd = new (region) cq_header;
    hd->version = kVersion;
    hd->header_size = static_cast<uint32_t>(kHeaderSize);
    hd->capacity = capacity;
    hd->max_messages = max_messages;
    hd->region_size = region_size;

    pthread_mutexattr_t attr;
    int r = pthread_mutexattr_init(&attr);
    if (r == 0) r = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (r == 0) r = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (r == 0) r = pthread_mutex_init(&hd->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    if (r != 0) {
        errno = r;
        return CQ_ESYS;
    }
    hd->state_idx.store(0, std::memory_order_relaxed);
    hd->state[0] = hd->state[1] = State{0, 0, 0};
    hd->consumers_waiting.store(0, std::memory_order_relaxed);
    hd->producers_waiting.store(0, std::memory_order_relaxed);
    hd->not_empty_seq.store(0, std::memory_order_relaxed);
    hd->not_full_seq.store(0, std::memory_order_relaxed);
    hd->magic.store(kMagic, std::memory_order_release);

    h->hdr = hd;
    h->ring = static_cast<uint8_t *>(region) + kHeaderSize;
    h->capacity = capacity;
    h->max_messages = max_messages;
    return CQ_OK;
}

int cq_attach(cq_handle *h, void *region, size_t region_size) {
    if (!h || !region) return CQ_EINVAL;
    if (region_size < kHeaderSize || reinterpret_cast<uintptr_t>(region) % alignof(cq_header) != 0)
        return CQ_EBADREGION;
    cq_header *hd = static_cast<cq_header *>(region);
    if (hd->magic.load(std::memory_order_acquire) != kMagic || hd->version != kVersion ||
        hd->header_size != kHeaderSize)
        return CQ_EBADREGION;
    // Trust nothing but what the mapping size confirms: the ring must lie inside the mapping.
    const uint64_t capacity = hd->capacity;
    const size_t need = cq_region_size(capacity);
    if (need == 0 || need > region_size) return CQ_EBADREGION;
    h->hdr = hd;
    h->ring = static_cast<uint8_t *>(region) + kHeaderSize;
    h->capacity = capacity;
    h->max_messages = hd->max_messages;
    return CQ_OK;
}

int cq_put_records(const cq_handle *h, const void *records, size_t nbytes, size_t n_records,
                   int64_t deadline_ns, int interruptible) {
    if (!h || !h->hdr || (!records && nbytes)) return CQ_EINVAL;
    if (n_records == 0) return nbytes == 0 ? CQ_OK : CQ_EINVAL;
    const uint8_t *p = static_cast<const uint8_t *>(records);
    // A malformed batch would poison the queue for every process: check it before it goes in.
    if (!records_well_formed(p, nbytes, n_records)) return CQ_EINVAL;
    return put_impl(h, p, nbytes, nullptr, 0, n_records, deadline_ns, interruptible);
}

int cq_put(const cq_handle *h, const void *payload, size_t len, int64_t deadline_ns) {
    if (!h || !h->hdr || (!payload && len)) return CQ_EINVAL;
    if (len > CQ_MAX_PAYLOAD) return CQ_E2BIG;
    const uint32_t len32 = static_cast<uint32_t>(len);
    uint8_t hdr[CQ_RECORD_HEADER];
    std::memcpy(hdr, &len32, sizeof(hdr));
    return put_impl(h, hdr, sizeof(hdr), static_cast<const uint8_t *>(payload), len, 1, deadline_ns, 0);
}

int cq_get_records(const cq_handle *h, void *out, size_t out_cap, size_t max_messages, int64_t deadline_ns,
                   int interruptible, size_t *n_out, size_t *nbytes_out, size_t *needed) {
    if (!h || !h->hdr || (!out && out_cap) || !n_out || !nbytes_out || !needed || max_messages == 0)
        return CQ_EINVAL;
    *n_out = *nbytes_out = *needed = 0;
    uint8_t *dst = static_cast<uint8_t *>(out);
    cq_header *hd = h->hdr;
    bool recovered = false;
    int r = lock_queue(h, deadline_ns, &recovered);
    if (r == kLockTimeout) return CQ_EMPTY;
    if (r != CQ_OK) return r;

    int status = CQ_OK;
    uint64_t wake_producers = 0, wake_consumers = 0;
    for (;;) {
        const State s = load_state(hd);
        if (!state_valid(h, s)) {
            status = CQ_ECORRUPT;
            break;
        }
        if (s.count > 0) {
            uint64_t pos = s.head, left = s.used, k = 0;
            size_t copied = 0;
            while (k < max_messages && k < s.count) {
                // Every length read from shared memory is checked against what is really there
                // before it is used to copy anything.
                if (left < CQ_RECORD_HEADER) {
                    status = CQ_ECORRUPT;
                    break;
                }
                uint32_t len;
                ring_read(h, pos, reinterpret_cast<uint8_t *>(&len), sizeof(len));
                const uint64_t rec = CQ_RECORD_HEADER + static_cast<uint64_t>(len);
                if (rec > left) {
                    status = CQ_ECORRUPT;
                    break;
                }
                if (rec > out_cap - copied) {
                    if (k == 0) {
                        *needed = static_cast<size_t>(rec);
                        status = CQ_BUF_TOO_SMALL;
                    }
                    break;
                }
                ring_read(h, pos, dst + copied, static_cast<size_t>(rec));
                copied += static_cast<size_t>(rec);
                pos = ring_advance(h, pos, rec);
                left -= rec;
                ++k;
            }
            if (status != CQ_OK) break;
            const uint64_t remaining = s.count - k;
            if ((remaining == 0) != (left == 0)) {  // count and bytes disagree: do not commit garbage
                status = CQ_ECORRUPT;
                break;
            }
            // An empty ring restarts at offset 0 so that later records rarely straddle the wrap point.
            commit(hd, State{remaining ? pos : 0, left, remaining});
            const uint32_t producers_sleeping = hd->producers_waiting.load(std::memory_order_relaxed);
            if (producers_sleeping != 0) {
                wake_producers = std::min<uint64_t>(producers_sleeping, k);
                hd->not_full_seq.fetch_add(1, std::memory_order_relaxed);
            }
            // Messages left and consumers asleep (we took fewer than were there): pass a wakeup on.
            if (remaining != 0 && hd->consumers_waiting.load(std::memory_order_relaxed) != 0) {
                wake_consumers = 1;
                hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
            }
            *n_out = static_cast<size_t>(k);
            *nbytes_out = copied;
            break;
        }
        r = wait_locked(h, &hd->not_empty_seq, &hd->consumers_waiting, deadline_ns, interruptible, &recovered);
        if (r == CQ_OK) continue;
        if (r == kWaitTimeout) {
            status = CQ_EMPTY;
            break;
        }
        if (r == CQ_EINTR) {
            status = CQ_EINTR;
            break;
        }
        if (recovered) wake_everyone(hd);  // lock not held
        return r == kLockTimeout ? CQ_EMPTY : r;
    }
    unlock_queue(h, recovered);
    if (!recovered) {
        if (wake_producers) futex_wake(&hd->not_full_seq, &hd->producers_waiting, wake_producers);
        if (wake_consumers) futex_wake(&hd->not_empty_seq, &hd->consumers_waiting, wake_consumers);
    }
    return status;
}

int cq_get_stats(const cq_handle *h, cq_stats *out) {
    if (!h || !h->hdr || !out) return CQ_EINVAL;
    bool recovered = false;
    const int r = lock_queue(h, cq_now_ns(), &recovered);
    if (r == kLockTimeout) {
        errno = ETIMEDOUT;
        return CQ_ESYS;
    }
    if (r != CQ_OK) return r;
    const cq_header *hd = h->hdr;
    const State s = load_state(hd);
    const bool ok = state_valid(h, s);
    out->count = s.count;
    out->used_bytes = s.used;
    out->capacity = h->capacity;
    out->max_messages = h->max_messages;
    out->recoveries = hd->recoveries;
    out->consumers_waiting = hd->consumers_waiting.load(std::memory_order_relaxed);
    out->producers_waiting = hd->producers_waiting.load(std::memory_order_relaxed);
    unlock_queue(h, recovered);
    return ok ? CQ_OK : CQ_ECORRUPT;
}

const char *cq_strstatus(int status) {
    switch (status) {
        case CQ_OK: return "ok";
        case CQ_EMPTY: return "empty";
        case CQ_FULL: return "full";
        case CQ_BUF_TOO_SMALL: return "output buffer too small";
        case CQ_EINTR: return "interrupted by a signal";
        case CQ_E2BIG: return "larger than the queue capacity";
        case CQ_EINVAL: return "invalid argument";
        case CQ_ECORRUPT: return "shared queue state is corrupt";
        case CQ_ESYS: return "system call failed";
        case CQ_EBADREGION: return "not a queue region (bad magic, version or size)";
        default: return "unknown status";
    }
}

int cq_test_lock_and_partial_put(const cq_handle *h, const void *records, size_t copy_bytes) {
    if (!h || !h->hdr || (!records && copy_bytes)) return CQ_EINVAL;
    bool recovered = false;
    const int r = lock_queue(h, CQ_FOREVER, &recovered);
    if (r != CQ_OK) return r;
    const State s = load_state(h->hdr);
    if (!state_valid(h, s)) return CQ_ECORRUPT;
    const uint64_t n = std::min<uint64_t>(copy_bytes, h->capacity - s.used);
    ring_write(h, ring_advance(h, s.head, s.used), static_cast<const uint8_t *>(records), static_cast<size_t>(n));
    return CQ_OK;  // deliberately still locked and uncommitted
}

}  // extern "C"
