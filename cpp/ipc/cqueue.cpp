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
//    which can block later signal/broadcast calls). Every futex wait is bounded (recheck interval).
//  * Who sleeps is known exactly, even across SIGKILL: a sleeper registers under the lock by claiming a
//    *waiter slot* whose robust mutex it holds until it deregisters. The kernel marks the slot mutex
//    OWNER_DIED when the sleeper dies, so a trylock tells a live sleeper (EBUSY) from a dead one
//    (EOWNERDEAD), and dead registrations are removed ("reaped") instead of inflating the counts forever.
//  * Wakers only make the futex_wake syscall when a registered sleeper has not been woken yet. That
//    "unwoken" number is a hint kept in one 64-bit word {generation, count}: sleepers add themselves under
//    the lock; wakers subtract what the kernel reports woken, after the syscall and without the lock; a
//    sleeper whose wait ends any other way subtracts itself. A process killed between those steps leaves
//    the hint too high, so under the lock it is clamped to the registered count -- when that drops to 0,
//    and at every reap -- and, if that changed it, the generation moves on so that waker subtractions
//    still in flight from before are dropped. The hint can over-estimate for a while (a spare, cheap
//    FUTEX_WAKE), never under-estimate (no wakeup is ever skipped because of it).
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
constexpr uint32_t kVersion = 2;                     // 2: waiter slots, generation-tagged wake hints
// A sleeper re-examines the queue at least this often even if nobody wakes it. This is a safety net for
// wakeups lost to a process killed between its unlock and its futex_wake (or a woken consumer killed
// before it consumed); it costs ~4 syscalls per second per sleeper, i.e. no measurable CPU.
constexpr int64_t kRecheckNs = 250'000'000;
constexpr int64_t kLockGraceNs = CQ_LOCK_GRACE_NS;  // see cqueue.h
// Waiting for the mutex is done in slices of this length (each slice re-tries the acquisition). A robust
// mutex waiter that the kernel woke to take over the lock, but that is killed before it does, takes that
// wakeup with it: if the lock was meanwhile taken by someone else through the uncontended path (without
// the FUTEX_WAITERS bit), the other waiters are never woken by its release. Slicing bounds the stall such
// a death can cause to one slice, instead of the whole grace (or forever, without a deadline).
constexpr int64_t kLockSliceNs = 50'000'000;
constexpr int64_t kNsPerSec = 1'000'000'000;
// A wake that woke nobody asks for a reap at most this often: usually such a wake only raced with a
// sleeper that had registered but not reached its futex_wait yet (that happens tens of thousands of times
// a second with several consumers), and a reap (one trylock per registered sleeper) is not free. A dead
// sleeper thus costs wakers useless wake syscalls for at most this long.
constexpr int64_t kReapIntervalNs = 50'000'000;
constexpr uint32_t kWaitSlots = CQ_WAIT_SLOTS;

// Futex bitsets: registered sleepers wait on kBitRegistered and are the only ones counted wakes reach;
// sleepers without a slot (all slots taken) wait on kBitOverflow and are woken only by wake_everyone, so
// that a counted wake is never spent on a sleeper the hint does not count.
constexpr uint32_t kBitRegistered = 1u, kBitOverflow = 2u;

// Waiter slot states. kSlotAbandoned is or-ed in by a sleeper that had to leave without the queue lock
// (it could not re-acquire it in time): the slot stays counted until the next reap frees it.
constexpr uint32_t kSlotFree = 0, kSlotConsumer = 1, kSlotProducer = 2, kSlotKindMask = 3, kSlotAbandoned = 4;

// Internal results of the lock / wait helpers.
constexpr int kLockTimeout = 100;  // lock not acquired (lock NOT held)
constexpr int kWaitTimeout = 101;  // deadline passed (lock held)

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words must be plain 32-bit words");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "wake hints must be lock-free");

}  // namespace

// The committed queue state (lives in the shared header, hence not in the anonymous namespace).
struct cq_committed_state {
    uint64_t head;   // ring offset of the first record, < capacity
    uint64_t used;   // bytes of records in the ring, <= capacity
    uint64_t count;  // number of records
};
using State = cq_committed_state;

// One registration of a sleeper. `owner` is held (locked) by the sleeping thread for as long as it is
// registered; it is only ever trylocked by others, so it is never contended.
struct alignas(64) cq_wait_slot {  // a cache line each: sleepers lock their own slot, not their neighbour's
    pthread_mutex_t owner;  // PTHREAD_PROCESS_SHARED | PTHREAD_MUTEX_ROBUST
    std::atomic<uint32_t> state;
};

// The shared header. Everything from `mutex` on, except the futex words, the wake hints and the slot
// states' abandoned flag, is protected by the mutex.
struct alignas(64) cq_header {
    std::atomic<uint64_t> magic;  // written last by cq_init
    uint32_t version;
    uint32_t header_size;
    uint64_t capacity;
    uint64_t max_messages;
    uint64_t region_size;

    alignas(64) pthread_mutex_t mutex;
    std::atomic<uint32_t> state_idx;  // which of state[0..1] is committed
    // Registered sleepers (slots in use) of each kind: exact, up to registrations of dead sleepers not
    // reaped yet. Changed only under the lock.
    uint32_t consumers_waiting;
    uint32_t producers_waiting;
    std::atomic<uint32_t> reap_requested;  // set without the lock: the next lock holder reaps
    // Wake hints {generation << 32 | registered sleepers not woken yet}; see the file comment.
    std::atomic<uint64_t> consumers_unwoken;
    std::atomic<uint64_t> producers_unwoken;
    State state[2];
    uint64_t recoveries;  // EOWNERDEAD recoveries, for diagnostics and tests

    // The futex words get their own cache lines: sleepers read them, wakers bump them.
    alignas(64) std::atomic<uint32_t> not_empty_seq;
    alignas(64) std::atomic<uint32_t> not_full_seq;

    alignas(64) uint64_t waiters_reaped;  // dead sleepers' registrations removed (diagnostics)
    std::atomic<int64_t> last_reap_ns;    // CLOCK_MONOTONIC time of the last reap (read without the lock)
    uint32_t slots_used;                  // slots [0, slots_used) may be in use (a high-water mark)
    alignas(64) cq_wait_slot slots[kWaitSlots];
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

// Sleep while *word == expected, until the absolute CLOCK_MONOTONIC deadline (always finite here).
// Returns 0 (woken) or an errno (EAGAIN: value already changed, ETIMEDOUT, EINTR).
int futex_wait_until(std::atomic<uint32_t> *word, uint32_t expected, int64_t deadline_ns, uint32_t bitset) {
    const timespec ts = to_timespec(deadline_ns);
    // FUTEX_WAIT_BITSET takes an absolute timeout on CLOCK_MONOTONIC (no FUTEX_CLOCK_REALTIME flag);
    // no FUTEX_PRIVATE_FLAG because the word is shared between processes.
    const long rc = syscall(SYS_futex, futex_addr(word), FUTEX_WAIT_BITSET, expected, &ts, nullptr, bitset);
    return rc == 0 ? 0 : errno;
}

long futex_wake_bitset(std::atomic<uint32_t> *word, int n, uint32_t bitset) {
    return syscall(SYS_futex, futex_addr(word), FUTEX_WAKE_BITSET, n, nullptr, nullptr, bitset);
}

// ---- wake hints {generation << 32 | count} ---------------------------------------------------------

inline uint32_t hint_count(uint64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t hint_gen(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

// Take n off the count without going below zero. With `gen_only`, only while the generation is still
// `gen` (a waker's subtraction; a clamp since then has accounted for it already).
void hint_sub(std::atomic<uint64_t> *a, uint32_t n, bool gen_only, uint32_t gen) {
    uint64_t cur = a->load(std::memory_order_relaxed);
    for (;;) {
        const uint32_t c = hint_count(cur);
        if (c == 0 || (gen_only && hint_gen(cur) != gen)) return;
        const uint64_t next = (cur & ~0xFFFFFFFFull) | (c > n ? c - n : 0u);
        if (a->compare_exchange_weak(cur, next, std::memory_order_relaxed)) return;
    }
}

// Under the lock: no more unwoken sleepers than registered ones. A change starts a new generation.
void hint_clamp(std::atomic<uint64_t> *a, uint32_t registered) {
    uint64_t cur = a->load(std::memory_order_relaxed);
    while (hint_count(cur) > registered) {
        const uint64_t next = (static_cast<uint64_t>(hint_gen(cur) + 1u) << 32) | registered;
        if (a->compare_exchange_weak(cur, next, std::memory_order_relaxed)) return;
    }
}

// The two kinds of sleepers, so that put and get share the waiting code.
struct Side {
    std::atomic<uint32_t> *seq;       // futex word they sleep on
    uint32_t *registered;             // consumers_waiting / producers_waiting
    std::atomic<uint64_t> *unwoken;   // wake hint
    uint32_t slot_kind;
};
inline Side consumers(cq_header *hd) {
    return Side{&hd->not_empty_seq, &hd->consumers_waiting, &hd->consumers_unwoken, kSlotConsumer};
}
inline Side producers(cq_header *hd) {
    return Side{&hd->not_full_seq, &hd->producers_waiting, &hd->producers_unwoken, kSlotProducer};
}

// Wake up to n registered sleepers of `side` (decided under the lock in generation `gen`, called after
// unlocking) and take the ones the kernel actually woke off the hint -- right away, so that puts/gets made
// before they get to run do not see them as sleeping and wake again (a futex wake that has to kick another
// CPU is the most expensive thing a put does). Nobody woken although the hint said someone was asleep:
// either a sleeper has not reached its futex_wait yet (it will see the sequence change) or the hint counts
// a dead sleeper -- ask the next lock holder to check the slots.
void wake_registered(cq_header *hd, const Side &side, uint64_t n, uint32_t gen) {
    const int count = n > static_cast<uint64_t>(INT_MAX) ? INT_MAX : static_cast<int>(n);
    const long woken = futex_wake_bitset(side.seq, count, kBitRegistered);
    if (woken > 0) {
        hint_sub(side.unwoken, static_cast<uint32_t>(woken), true, gen);
    } else if (woken == 0 && !hd->reap_requested.load(std::memory_order_relaxed) &&
               cq_now_ns() - hd->last_reap_ns.load(std::memory_order_relaxed) >= kReapIntervalNs) {
        hd->reap_requested.store(1, std::memory_order_relaxed);
    }
}

// Wake every sleeper of both kinds, registered or not. Bumping the words first makes a sleeper that
// registered but has not reached futex_wait yet return at once (EAGAIN); the bumps are atomic, so this is
// safe with or without the lock. The hints are left alone (an over-estimate: each woken sleeper clamps
// them when it deregisters).
void wake_everyone(cq_header *hd) {
    hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
    hd->not_full_seq.fetch_add(1, std::memory_order_relaxed);
    futex_wake_bitset(&hd->not_empty_seq, INT_MAX, FUTEX_BITSET_MATCH_ANY);
    futex_wake_bitset(&hd->not_full_seq, INT_MAX, FUTEX_BITSET_MATCH_ANY);
}

// ---- waiter slots (all under the queue lock, except abandon_slot) -----------------------------------

// Find the registrations of dead sleepers and remove them; recount the registered sleepers of each kind
// from the slots (so a lock holder that died half-way through a registration leaves no trace either) and
// clamp the hints to the counts. A slot whose owner mutex is held by a live thread (EBUSY: a sleeper, or
// this very thread before it deregisters) stays.
void reap(cq_header *hd) {
    uint32_t n_cons = 0, n_prod = 0, last_used = 0;
    const uint32_t used = std::min(hd->slots_used, kWaitSlots);
    for (uint32_t i = 0; i < used; ++i) {
        cq_wait_slot *s = &hd->slots[i];
        const uint32_t st = s->state.load(std::memory_order_relaxed);
        if (st == kSlotFree) continue;
        int r = pthread_mutex_trylock(&s->owner);
        if (r == EBUSY) {
            const uint32_t kind = st & kSlotKindMask;
            n_cons += kind == kSlotConsumer;
            n_prod += kind == kSlotProducer;
            last_used = i + 1;
            continue;
        }
        if (r == EOWNERDEAD) {  // the sleeper died while registered
            pthread_mutex_consistent(&s->owner);
            if (!(st & kSlotAbandoned)) ++hd->waiters_reaped;
            r = 0;
        }
        s->state.store(kSlotFree, std::memory_order_relaxed);
        if (r == 0) pthread_mutex_unlock(&s->owner);
        // (any other error means a corrupted slot mutex: the slot is dropped; claim_slot skips it)
    }
    hd->slots_used = last_used;
    hd->last_reap_ns.store(cq_now_ns(), std::memory_order_relaxed);
    hd->consumers_waiting = n_cons;
    hd->producers_waiting = n_prod;
    hint_clamp(&hd->consumers_unwoken, n_cons);
    hint_clamp(&hd->producers_unwoken, n_prod);
}

// The slot this thread used last: tried first, so that a thread that sleeps again and again (a consumer
// on an often-empty queue) touches its own, cache-hot slot line instead of scanning everybody's under the
// queue lock. Only a hint (shared by all queues; a forked child inherits it): any free slot will do.
thread_local uint32_t t_last_slot = 0;

// Take slot i if it is free. Called under the queue lock.
bool try_claim(cq_header *hd, uint32_t i, const Side &side) {
    cq_wait_slot *s = &hd->slots[i];
    if (s->state.load(std::memory_order_relaxed) != kSlotFree) return false;
    int r = pthread_mutex_trylock(&s->owner);
    if (r == EOWNERDEAD) {  // someone died between locking it and marking it taken: ours now
        pthread_mutex_consistent(&s->owner);
        r = 0;
    }
    if (r != 0) return false;  // EBUSY: a sleeper that left without the lock is still letting go of it
    // High-water mark first: reap() only looks below it, and must see the slot even if we die here.
    if (i >= hd->slots_used) hd->slots_used = i + 1;
    s->state.store(side.slot_kind, std::memory_order_relaxed);
    ++*side.registered;
    side.unwoken->fetch_add(1, std::memory_order_relaxed);
    t_last_slot = i;
    return true;
}

// Register as a sleeper of `side`: claim a free slot and lock its owner mutex. Returns the slot index, or
// -1 when every slot is taken (the caller then sleeps unregistered, in short polls).
int claim_slot(cq_header *hd, const Side &side) {
    const uint32_t hint = t_last_slot < kWaitSlots ? t_last_slot : 0;
    if (try_claim(hd, hint, side)) return static_cast<int>(hint);
    for (uint32_t i = 0; i < kWaitSlots; ++i) {
        if (i != hint && try_claim(hd, i, side)) return static_cast<int>(i);
    }
    return -1;
}

// Deregister (lock held). The state is cleared before the owner mutex is released, so a thread dying in
// between leaves a free slot with an OWNER_DIED mutex, which claim_slot takes over. When the last sleeper
// of its kind leaves, nobody can be unwoken: whatever the hint still says is left over from a process
// killed half-way through its bookkeeping (or a waker's subtraction still in flight), and is dropped.
// (Clamping at every deregistration would also be correct, but it would often cancel the in-flight
// subtraction of the waker that just woke us -- the common, harmless race -- and leave the hint high.)
void release_slot(cq_header *hd, int slot, const Side &side) {
    cq_wait_slot *s = &hd->slots[slot];
    s->state.store(kSlotFree, std::memory_order_relaxed);
    pthread_mutex_unlock(&s->owner);
    if (*side.registered) --*side.registered;
    if (*side.registered == 0) hint_clamp(side.unwoken, 0);
}

// Deregister without the lock (it could not be re-acquired in time): mark the slot abandoned, let go of
// it and have the next lock holder reap it. It stays counted until then.
void abandon_slot(cq_header *hd, int slot) {
    cq_wait_slot *s = &hd->slots[slot];
    s->state.fetch_or(kSlotAbandoned, std::memory_order_relaxed);
    pthread_mutex_unlock(&s->owner);
    hd->reap_requested.store(1, std::memory_order_relaxed);
}

// ---- the lock --------------------------------------------------------------------------------------

// Lock `m`, waiting at most until the absolute CLOCK_MONOTONIC time `until_ns`.
int timed_lock(pthread_mutex_t *m, int64_t until_ns) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    const timespec ts = to_timespec(until_ns);
    return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
#else
    timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    const int64_t rel = until_ns - cq_now_ns();
    const timespec abs_rt = to_timespec(add_sat(rt.tv_sec * kNsPerSec + rt.tv_nsec, std::max<int64_t>(rel, 0)));
    return pthread_mutex_timedlock(m, &abs_rt);
#endif
}

// Acquire the queue mutex. A dead previous owner (EOWNERDEAD) is recovered here: the committed state is
// consistent by construction, so all that is left is to mark the mutex consistent, recount the sleepers
// (it may have died half-way through registering or deregistering one) and remember to wake every
// sleeper (the dead owner may have owed them a wakeup). Returns CQ_OK (lock held), kLockTimeout or
// CQ_ESYS (lock not held).
int lock_queue(const cq_handle *h, int64_t deadline_ns, bool *recovered) {
    cq_header *hd = h->hdr;
    pthread_mutex_t *m = &hd->mutex;
    int r = pthread_mutex_trylock(m);  // fast path: no clock read when uncontended
    if (r == EBUSY) {
        int64_t now = cq_now_ns();
        const int64_t until =
            deadline_ns == CQ_FOREVER ? CQ_FOREVER : std::max(deadline_ns, add_sat(now, kLockGraceNs));
        for (;;) {
            const int64_t slice_end = std::min(until, add_sat(now, kLockSliceNs));
            r = timed_lock(m, slice_end);
            if (r != ETIMEDOUT || slice_end >= until) break;
            now = cq_now_ns();
        }
    }
    if (r == 0) {
        if (hd->reap_requested.load(std::memory_order_relaxed)) {
            hd->reap_requested.store(0, std::memory_order_relaxed);
            reap(hd);
        }
        return CQ_OK;
    }
    if (r == EOWNERDEAD) {
        hd->recoveries++;
        pthread_mutex_consistent(m);
        hd->reap_requested.store(0, std::memory_order_relaxed);
        reap(hd);
        *recovered = true;
        return CQ_OK;
    }
    if (r == ETIMEDOUT) return kLockTimeout;
    errno = r;  // ENOTRECOVERABLE (only if someone unlocked without recovering) or EINVAL
    return CQ_ESYS;
}

// Release the mutex. The first unlock after a recovery wakes every sleeper, so nobody waits for a wakeup
// the dead owner never sent.
void unlock_queue(const cq_handle *h, bool *recovered) {
    pthread_mutex_unlock(&h->hdr->mutex);
    if (*recovered) {
        *recovered = false;
        wake_everyone(h->hdr);
    }
}

// Called with the lock held: register as a sleeper of `side`, unlock, sleep until woken, the deadline or
// the recheck interval, relock, deregister. Returns CQ_OK (lock held: re-examine the state), kWaitTimeout
// (lock held: the deadline has passed), CQ_EINTR (lock held), or kLockTimeout / CQ_ESYS (lock NOT held).
int wait_locked(const cq_handle *h, const Side &side, int64_t deadline_ns, int interruptible, bool *recovered) {
    const int64_t now = cq_now_ns();
    if (deadline_ns <= now) return kWaitTimeout;
    cq_header *hd = h->hdr;
    const int slot = claim_slot(hd, side);
    // Read the sequence under the lock: any waker that changes the state after we unlock must also bump
    // it, so futex_wait below either sees the new value (EAGAIN) or is woken.
    const uint32_t expected = side.seq->load(std::memory_order_relaxed);
    unlock_queue(h, recovered);
    const int64_t recheck = slot >= 0 ? kRecheckNs : CQ_OVERFLOW_RECHECK_NS;
    const int err = futex_wait_until(side.seq, expected, std::min(deadline_ns, add_sat(now, recheck)),
                                     slot >= 0 ? kBitRegistered : kBitOverflow);
    // Woken (err == 0): the waker takes us off the hint. Otherwise (timeout, value changed before we
    // slept, signal) nobody does: do it ourselves.
    if (slot >= 0 && err != 0) hint_sub(side.unwoken, 1, false, 0);
    const int lr = lock_queue(h, deadline_ns, recovered);
    if (lr != CQ_OK) {
        if (slot >= 0) abandon_slot(hd, slot);
        return lr;
    }
    if (slot >= 0) release_slot(hd, slot, side);
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
    const Side cons = consumers(hd), prods = producers(hd);
    bool recovered = false;
    int r = lock_queue(h, deadline_ns, &recovered);
    if (r == kLockTimeout) return CQ_FULL;
    if (r != CQ_OK) return r;

    int status = CQ_OK;
    uint64_t wake_consumers = 0;
    uint32_t wake_gen = 0;
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
            // Only pay for a wakeup when someone sleeps unwoken; wake as many as there are new messages.
            const uint64_t hint = hd->consumers_unwoken.load(std::memory_order_relaxed);
            if (hint_count(hint) != 0) {
                wake_consumers = std::min<uint64_t>(hint_count(hint), n);
                wake_gen = hint_gen(hint);
                hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
            }
            break;
        }
        r = wait_locked(h, prods, deadline_ns, interruptible, &recovered);
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
    const bool woke_all = recovered;
    unlock_queue(h, &recovered);
    if (wake_consumers && !woke_all) wake_registered(hd, cons, wake_consumers, wake_gen);
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
    for (uint32_t i = 0; r == 0 && i < kWaitSlots; ++i) {
        r = pthread_mutex_init(&hd->slots[i].owner, &attr);
        hd->slots[i].state.store(kSlotFree, std::memory_order_relaxed);
    }
    pthread_mutexattr_destroy(&attr);
    if (r != 0) {
        errno = r;
        return CQ_ESYS;
    }
    hd->state_idx.store(0, std::memory_order_relaxed);
    hd->state[0] = hd->state[1] = State{0, 0, 0};
    hd->consumers_waiting = hd->producers_waiting = 0;
    hd->reap_requested.store(0, std::memory_order_relaxed);
    hd->consumers_unwoken.store(0, std::memory_order_relaxed);
    hd->producers_unwoken.store(0, std::memory_order_relaxed);
    hd->not_empty_seq.store(0, std::memory_order_relaxed);
    hd->not_full_seq.store(0, std::memory_order_relaxed);
    hd->waiters_reaped = 0;
    hd->last_reap_ns.store(0, std::memory_order_relaxed);
    hd->slots_used = 0;
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
    const Side cons = consumers(hd), prods = producers(hd);
    bool recovered = false;
    int r = lock_queue(h, deadline_ns, &recovered);
    if (r == kLockTimeout) return CQ_EMPTY;
    if (r != CQ_OK) return r;

    int status = CQ_OK;
    uint64_t wake_producers = 0, wake_consumers = 0;
    uint32_t prod_gen = 0, cons_gen = 0;
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
            const uint64_t ph = hd->producers_unwoken.load(std::memory_order_relaxed);
            if (hint_count(ph) != 0) {
                wake_producers = std::min<uint64_t>(hint_count(ph), k);
                prod_gen = hint_gen(ph);
                hd->not_full_seq.fetch_add(1, std::memory_order_relaxed);
            }
            // Messages left and consumers asleep (we took fewer than were there): pass a wakeup on.
            const uint64_t ch = hd->consumers_unwoken.load(std::memory_order_relaxed);
            if (remaining != 0 && hint_count(ch) != 0) {
                wake_consumers = 1;
                cons_gen = hint_gen(ch);
                hd->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
            }
            *n_out = static_cast<size_t>(k);
            *nbytes_out = copied;
            break;
        }
        r = wait_locked(h, cons, deadline_ns, interruptible, &recovered);
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
    const bool woke_all = recovered;
    unlock_queue(h, &recovered);
    if (!woke_all) {
        if (wake_producers) wake_registered(hd, prods, wake_producers, prod_gen);
        if (wake_consumers) wake_registered(hd, cons, wake_consumers, cons_gen);
    }
    return status;
}

int cq_get_stats(const cq_handle *h, cq_stats *out, int check_waiters) {
    if (!h || !h->hdr || !out) return CQ_EINVAL;
    bool recovered = false;
    const int r = lock_queue(h, cq_now_ns(), &recovered);
    if (r == kLockTimeout) {
        errno = ETIMEDOUT;
        return CQ_ESYS;
    }
    if (r != CQ_OK) return r;
    cq_header *hd = h->hdr;
    if (check_waiters) reap(hd);
    const State s = load_state(hd);
    const bool ok = state_valid(h, s);
    out->count = s.count;
    out->used_bytes = s.used;
    out->capacity = h->capacity;
    out->max_messages = h->max_messages;
    out->recoveries = hd->recoveries;
    out->waiters_reaped = hd->waiters_reaped;
    out->consumers_waiting = hd->consumers_waiting;
    out->producers_waiting = hd->producers_waiting;
    out->consumers_unwoken = hint_count(hd->consumers_unwoken.load(std::memory_order_relaxed));
    out->producers_unwoken = hint_count(hd->producers_unwoken.load(std::memory_order_relaxed));
    unlock_queue(h, &recovered);
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

int cq_test_lock(const cq_handle *h, int try_only) {
    if (!h || !h->hdr) return CQ_EINVAL;
    if (try_only) {
        const int r = pthread_mutex_trylock(&h->hdr->mutex);
        if (r == EOWNERDEAD) pthread_mutex_consistent(&h->hdr->mutex);
        return r == 0 || r == EOWNERDEAD ? CQ_OK : CQ_FULL;
    }
    bool recovered = false;
    return lock_queue(h, CQ_FOREVER, &recovered);
}

void cq_test_unlock(const cq_handle *h) {
    if (h && h->hdr) pthread_mutex_unlock(&h->hdr->mutex);
}

int cq_test_wake_consumers_unaccounted(const cq_handle *h) {
    if (!h || !h->hdr) return CQ_EINVAL;
    h->hdr->not_empty_seq.fetch_add(1, std::memory_order_relaxed);
    return static_cast<int>(futex_wake_bitset(&h->hdr->not_empty_seq, INT_MAX, kBitRegistered));
}

}  // extern "C"
