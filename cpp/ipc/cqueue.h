/*
 * cqueue.h -- C-style core of the sf.ipc shared-memory queue (no Python in here).
 *
 * A multi-producer / multi-consumer FIFO of variable-size byte messages, stored in a circular buffer
 * inside one shared memory region (see docs/ipc.md for the layout and the locking protocol).
 *
 *   region = [ header (mutex, committed state, futex words) | ring of `capacity` bytes ]
 *
 * Messages travel as *records*: a little-endian uint32 payload length followed by the payload. The
 * put functions take a caller buffer of back-to-back records (so a batch is one memcpy into the ring),
 * the get function returns records the same way. The core never interprets payloads.
 *
 * Time: every blocking call takes an absolute deadline on CLOCK_MONOTONIC in nanoseconds
 * (cq_now_ns() + timeout). CQ_FOREVER blocks without limit; any deadline already in the past
 * (CQ_NONBLOCK is one) means "do not wait for data or space".
 *
 * Crash safety: the mutex is PTHREAD_MUTEX_ROBUST; the queue state (head, used bytes, count) is
 * committed with a single atomic store after the bytes are copied, so a process that dies at any
 * instruction leaves either the old or the new state -- never a half-written message. A sleeper holds a
 * robust "waiter slot" mutex of its own while it is registered, so the registration of a sleeper that is
 * killed is found (EOWNERDEAD) and removed: the waiter counts never stay inflated by dead processes.
 * Every sleep is a bounded futex wait; a timed call returns at most CQ_LOCK_GRACE_NS after its deadline.
 *
 * Thread safety: all functions may be called concurrently from any thread of any process that maps
 * the region, except cq_init (once, before sharing).
 */
#ifndef SF_CQUEUE_H
#define SF_CQUEUE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. >= 0: an expected outcome; < 0: an error. */
enum cq_status {
    CQ_OK = 0,
    CQ_EMPTY = 1,         /* get: nothing arrived before the deadline */
    CQ_FULL = 2,          /* put: no room before the deadline */
    CQ_BUF_TOO_SMALL = 3, /* get: the next record does not fit the output buffer; *needed says how big */
    CQ_EINTR = 4,         /* a signal interrupted a wait (only when `interruptible`); retry or give up */
    CQ_E2BIG = -1,        /* a message or batch can never fit the queue's capacity */
    CQ_EINVAL = -2,       /* bad argument (malformed records, sizes out of range, null pointers) */
    CQ_ECORRUPT = -3,     /* the shared state or a stored length failed a bounds check */
    CQ_ESYS = -4,         /* a system call failed; errno is set */
    CQ_EBADREGION = -5    /* attach: not a queue region (magic, version or sizes do not match) */
};

/* Bytes of record header in front of every payload (a uint32 length). */
#define CQ_RECORD_HEADER 4u
/* Largest payload a record can describe. */
#define CQ_MAX_PAYLOAD 0xFFFFFFFFu
/* Smallest and largest ring capacity accepted by cq_init. */
#define CQ_MIN_CAPACITY 64u
#define CQ_MAX_CAPACITY (1ull << 40)

#define CQ_FOREVER INT64_MAX
#define CQ_NONBLOCK ((int64_t)0)

/* How far past its deadline a timed call may return: waiting for the mutex (held only for a memcpy) may
 * run this much past the deadline, so that contention alone never turns into a spurious EMPTY/FULL,
 * while a holder that is stopped (SIGSTOP) cannot block a timed call for longer than this. */
#define CQ_LOCK_GRACE_NS 1000000000ll
/* Sleepers tracked individually (one robust waiter slot each). More concurrent sleepers than this still
 * work, but sleep in short polls (CQ_OVERFLOW_RECHECK_NS) and are not counted in cq_stats. */
#define CQ_WAIT_SLOTS 256u
#define CQ_OVERFLOW_RECHECK_NS 10000000ll

/* Process-local view of a mapped queue. Sizes are cached here when the region is validated and are
 * never re-read from shared memory, so a corrupted header cannot make us index out of bounds. */
typedef struct cq_handle {
    struct cq_header *hdr;  /* start of the region */
    uint8_t *ring;          /* first byte of the circular buffer */
    uint64_t capacity;      /* ring size in bytes */
    uint64_t max_messages;  /* 0 = no limit on the number of messages */
} cq_handle;

/* Snapshot of counters, for qsize()/full()/diagnostics. */
typedef struct cq_stats {
    uint64_t count;             /* messages in the queue */
    uint64_t used_bytes;        /* ring bytes in use (records incl. headers) */
    uint64_t capacity;          /* ring size in bytes */
    uint64_t max_messages;      /* 0 = unlimited */
    uint64_t recoveries;        /* times a lock holder was found dead and the state restored */
    uint64_t waiters_reaped;    /* registrations of sleepers found dead and removed */
    uint32_t consumers_waiting; /* consumers registered as sleeping in a get (exact when check_waiters) */
    uint32_t producers_waiting; /* producers registered as sleeping in a put (exact when check_waiters) */
    uint32_t consumers_unwoken; /* wake hint: of those, not woken yet (never an under-estimate) */
    uint32_t producers_unwoken;
} cq_stats;

/* Current CLOCK_MONOTONIC time in nanoseconds. */
int64_t cq_now_ns(void);
/* Absolute deadline `timeout_ns` from now, saturating; negative timeout -> CQ_FOREVER. */
int64_t cq_deadline_after(int64_t timeout_ns);

/* Bytes of shared memory needed for a queue whose ring holds `capacity` bytes (0 if out of range). */
size_t cq_region_size(uint64_t capacity);

/* Initialise a fresh region of `region_size` bytes (>= cq_region_size(capacity)) and fill `h`. */
int cq_init(cq_handle *h, void *region, size_t region_size, uint64_t capacity, uint64_t max_messages);

/* Validate an existing region (created by cq_init, possibly in another process) and fill `h`. */
int cq_attach(cq_handle *h, void *region, size_t region_size);

/* Put `n_records` records laid out back to back in `records` (`nbytes` in total). All or nothing:
 * waits until the whole batch fits. Returns CQ_OK, CQ_FULL (deadline passed), CQ_E2BIG (the batch
 * is larger than the capacity, in bytes or messages: it would never fit), CQ_EINVAL, CQ_ECORRUPT,
 * CQ_EINTR. */
int cq_put_records(const cq_handle *h, const void *records, size_t nbytes, size_t n_records,
                   int64_t deadline_ns, int interruptible);

/* Convenience: put one message of `len` payload bytes. */
int cq_put(const cq_handle *h, const void *payload, size_t len, int64_t deadline_ns);

/* Get up to `max_messages` records into `out` (at most `out_cap` bytes). Waits until at least one
 * message is there. On CQ_OK, *n_out >= 1 records of *nbytes_out bytes in total were removed from
 * the queue. CQ_BUF_TOO_SMALL: the first waiting record needs *needed bytes of buffer; nothing was
 * removed. Other results: CQ_EMPTY, CQ_EINVAL, CQ_ECORRUPT, CQ_EINTR. */
int cq_get_records(const cq_handle *h, void *out, size_t out_cap, size_t max_messages,
                   int64_t deadline_ns, int interruptible, size_t *n_out, size_t *nbytes_out,
                   size_t *needed);

/* Counters; takes the lock briefly (never longer than ~CQ_LOCK_GRACE_NS, even if a holder is stopped).
 * check_waiters != 0: first find and remove the registrations of sleepers that died (one trylock per
 * registered sleeper), so that consumers_waiting / producers_waiting are exact. */
int cq_get_stats(const cq_handle *h, cq_stats *out, int check_waiters);

/* Short human-readable name of a status code. */
const char *cq_strstatus(int status);

/* ---- testing hook (used by cpp/ipc/test_cqueue.cpp only) --------------------------------------
 * Lock the queue and copy the first `copy_bytes` bytes of `records` into the ring at the tail, then
 * return WITHOUT committing or unlocking -- exactly what a producer killed mid-copy leaves behind.
 * The caller is expected to exit (or die) afterwards. */
int cq_test_lock_and_partial_put(const cq_handle *h, const void *records, size_t copy_bytes);

/* Take (try_only: only if free at once; CQ_FULL otherwise) / release the queue lock, nothing else (to
 * stage lock hand-over races). */
int cq_test_lock(const cq_handle *h, int try_only);
void cq_test_unlock(const cq_handle *h);

/* Wake every registered sleeping consumer WITHOUT the waker's bookkeeping -- what a producer killed
 * between its FUTEX_WAKE and its accounting leaves behind. Returns how many the kernel woke. */
int cq_test_wake_consumers_unaccounted(const cq_handle *h);

#ifdef __cplusplus
}
#endif

#endif /* SF_CQUEUE_H */
