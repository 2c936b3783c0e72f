// test_cqueue.cpp -- unit tests of the C core (cqueue.h), without Python.
//
// Build and run (tests/ipc/test_cpp_core.py does exactly this):
//   g++ -std=c++17 -O2 -Wall -Wextra -Werror cpp/ipc/test_cqueue.cpp cpp/ipc/cqueue.cpp -lpthread -o t && ./t
#include "cqueue.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_failures = 0;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                      \
        }                                                                      \
    } while (0)

#define CHECK_EQ(a, b)                                                                         \
    do {                                                                                       \
        const long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);      \
        if (va_ != vb_) {                                                                      \
            std::fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__, \
                         __LINE__, #a, va_, #b, vb_);                                          \
            ++g_failures;                                                                      \
        }                                                                                      \
    } while (0)

namespace {

// A queue in an anonymous shared mapping (inherited by fork children), unmapped on scope exit.
struct Region {
    void *mem = nullptr;
    size_t size = 0;
    cq_handle h{};
    Region(uint64_t capacity, uint64_t max_messages) {
        size = cq_region_size(capacity);
        mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) {
            std::perror("mmap");
            std::exit(2);
        }
        if (cq_init(&h, mem, size, capacity, max_messages) != CQ_OK) {
            std::fprintf(stderr, "cq_init failed\n");
            std::exit(2);
        }
    }
    ~Region() { munmap(mem, size); }
    Region(const Region &) = delete;
    Region &operator=(const Region &) = delete;
};

// Append one record (uint32 length + payload) to a batch buffer.
void append_record(std::vector<uint8_t> &buf, const void *payload, uint32_t len) {
    const size_t off = buf.size();
    buf.resize(off + CQ_RECORD_HEADER + len);
    std::memcpy(buf.data() + off, &len, sizeof(len));
    if (len) std::memcpy(buf.data() + off + CQ_RECORD_HEADER, payload, len);
}

// Split a get buffer back into payloads.
std::vector<std::string> split_records(const std::vector<uint8_t> &buf, size_t nbytes) {
    std::vector<std::string> out;
    size_t off = 0;
    while (off < nbytes) {
        uint32_t len;
        std::memcpy(&len, buf.data() + off, sizeof(len));
        out.emplace_back(reinterpret_cast<const char *>(buf.data() + off + CQ_RECORD_HEADER), len);
        off += CQ_RECORD_HEADER + len;
    }
    return out;
}

int get_one(const cq_handle &h, std::string *msg, int64_t deadline) {
    std::vector<uint8_t> buf(1 << 20);
    size_t n = 0, nbytes = 0, needed = 0;
    const int r = cq_get_records(&h, buf.data(), buf.size(), 1, deadline, 0, &n, &nbytes, &needed);
    if (r == CQ_OK) *msg = split_records(buf, nbytes).at(0);
    return r;
}

// Self-checking payload: producer id, sequence number, a filler byte derived from both, a trailing
// check word. Cheap to build (memset), so that killed producers spend much of their time copying
// under the lock -- which is what the SIGKILL test wants to hit.
std::string make_payload(uint32_t producer, uint32_t seq, size_t len) {
    std::string s(len < 12 ? 12 : len, static_cast<char>((producer * 7u + seq * 13u) & 0xff));
    std::memcpy(&s[0], &producer, 4);
    std::memcpy(&s[4], &seq, 4);
    const uint32_t check = producer * 2654435761u ^ seq * 40503u ^ static_cast<uint32_t>(s.size());
    std::memcpy(&s[s.size() - 4], &check, 4);
    return s;
}

bool payload_intact(const std::string &s, uint32_t *producer, uint32_t *seq) {
    if (s.size() < 12) return false;
    std::memcpy(producer, &s[0], 4);
    std::memcpy(seq, &s[4], 4);
    return s == make_payload(*producer, *seq, s.size());
}

// Verify a record in place (no allocation): the SIGKILL test needs a consumer faster than its
// producers, so that they spend their time copying under the lock rather than asleep on a full ring.
// `stride` > 1 samples the filler (the header and the check word are always verified).
bool record_intact(const uint8_t *payload, uint32_t len, uint32_t *producer, uint32_t *seq, uint32_t stride = 1) {
    if (len < 12) return false;
    std::memcpy(producer, payload, 4);
    std::memcpy(seq, payload + 4, 4);
    const uint8_t fill = static_cast<uint8_t>((*producer * 7u + *seq * 13u) & 0xff);
    uint8_t diff = 0;
    for (uint32_t i = 8; i < len - 4; i += stride) diff |= static_cast<uint8_t>(payload[i] ^ fill);
    diff |= static_cast<uint8_t>(payload[len - 5] ^ fill);
    uint32_t check;
    std::memcpy(&check, payload + len - 4, 4);
    return diff == 0 && check == (*producer * 2654435761u ^ *seq * 40503u ^ len);
}

void test_basic_fifo() {
    Region r(4096, 0);
    std::string m;
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_EMPTY);
    CHECK_EQ(cq_put(&r.h, "hello", 5, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(cq_put(&r.h, "", 0, CQ_NONBLOCK), CQ_OK);  // empty payloads are legal
    CHECK_EQ(cq_put(&r.h, "world!", 6, CQ_NONBLOCK), CQ_OK);
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 1), CQ_OK);
    CHECK_EQ(st.count, 3);
    CHECK_EQ(st.used_bytes, 3 * CQ_RECORD_HEADER + 11);
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m == "hello");
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m.empty());
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m == "world!");
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_EMPTY);
}

void test_wraparound_and_batches() {
    // Odd sizes in a small ring force records (and their length headers) to straddle the wrap point.
    Region r(1000, 0);
    std::mt19937 rng(1);
    uint32_t next_put = 0, next_get = 0;
    std::vector<uint8_t> out(4096);
    for (int round = 0; round < 20000; ++round) {
        std::vector<uint8_t> batch;
        const uint32_t k = 1 + rng() % 5;
        for (uint32_t i = 0; i < k; ++i) {
            const std::string p = make_payload(0, next_put + i, 12 + rng() % 60);
            append_record(batch, p.data(), static_cast<uint32_t>(p.size()));
        }
        const int pr = cq_put_records(&r.h, batch.data(), batch.size(), k, CQ_NONBLOCK, 0);
        CHECK(pr == CQ_OK || pr == CQ_FULL);
        if (pr == CQ_OK) next_put += k;
        size_t n = 0, nbytes = 0, needed = 0;
        const int gr = cq_get_records(&r.h, out.data(), out.size(), 1 + rng() % 7, CQ_NONBLOCK, 0, &n, &nbytes, &needed);
        CHECK(gr == CQ_OK || gr == CQ_EMPTY);
        if (gr == CQ_OK) {
            for (const std::string &p : split_records(out, nbytes)) {
                uint32_t prod, seq;
                CHECK(payload_intact(p, &prod, &seq));
                CHECK_EQ(seq, next_get);
                ++next_get;
            }
        }
    }
    CHECK(next_get > 10000);
}

void test_limits_and_errors() {
    Region r(256, 3);
    std::vector<uint8_t> big(300, 'x');
    CHECK_EQ(cq_put(&r.h, big.data(), 253, CQ_FOREVER), CQ_E2BIG);  // 253 + 4 > 256: never fits, no hang
    CHECK_EQ(cq_put(&r.h, big.data(), 252, CQ_NONBLOCK), CQ_OK);    // exactly the capacity
    CHECK_EQ(cq_put(&r.h, "a", 1, CQ_NONBLOCK), CQ_FULL);
    std::vector<uint8_t> small(8);
    size_t n, nbytes, needed;
    CHECK_EQ(cq_get_records(&r.h, small.data(), small.size(), 10, CQ_NONBLOCK, 0, &n, &nbytes, &needed),
             CQ_BUF_TOO_SMALL);
    CHECK_EQ(needed, 256);
    std::string m;
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(m.size(), 252);

    // Message-count limit.
    for (int i = 0; i < 3; ++i) CHECK_EQ(cq_put(&r.h, "m", 1, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(cq_put(&r.h, "m", 1, CQ_NONBLOCK), CQ_FULL);
    std::vector<uint8_t> batch;
    for (int i = 0; i < 4; ++i) append_record(batch, "b", 1);
    CHECK_EQ(cq_put_records(&r.h, batch.data(), batch.size(), 4, CQ_FOREVER, 0), CQ_E2BIG);

    // Malformed batches are refused before they touch the ring.
    std::vector<uint8_t> bad = batch;
    uint32_t huge = 1000;
    std::memcpy(bad.data(), &huge, 4);
    CHECK_EQ(cq_put_records(&r.h, bad.data(), bad.size(), 4, CQ_NONBLOCK, 0), CQ_EINVAL);
    CHECK_EQ(cq_put_records(&r.h, batch.data(), batch.size(), 3, CQ_NONBLOCK, 0), CQ_EINVAL);
    CHECK_EQ(cq_get_records(&r.h, small.data(), small.size(), 0, CQ_NONBLOCK, 0, &n, &nbytes, &needed), CQ_EINVAL);
    CHECK_EQ(cq_region_size(1), 0);

    // Attach validation.
    cq_handle h2{};
    CHECK_EQ(cq_attach(&h2, r.mem, r.size), CQ_OK);
    CHECK_EQ(h2.capacity, 256);
    CHECK_EQ(h2.max_messages, 3);
    CHECK_EQ(cq_attach(&h2, r.mem, 100), CQ_EBADREGION);
    std::vector<uint8_t> junk(r.size, 0xab);
    CHECK_EQ(cq_attach(&h2, junk.data(), junk.size()), CQ_EBADREGION);
    // A header claiming a ring larger than the mapping is refused.
    std::vector<uint64_t> copy((r.size + 7) / 8);
    std::memcpy(copy.data(), r.mem, r.size);
    uint64_t fake_capacity = 1 << 20;
    std::memcpy(reinterpret_cast<uint8_t *>(copy.data()) + 16, &fake_capacity, 8);  // capacity field
    CHECK_EQ(cq_attach(&h2, copy.data(), r.size), CQ_EBADREGION);
}

void test_timeouts() {
    Region r(128, 1);
    std::string m;
    int64_t t0 = cq_now_ns();
    CHECK_EQ(get_one(r.h, &m, cq_deadline_after(50'000'000)), CQ_EMPTY);
    int64_t dt = cq_now_ns() - t0;
    CHECK(dt >= 50'000'000 && dt < 250'000'000);
    CHECK_EQ(cq_put(&r.h, "x", 1, CQ_NONBLOCK), CQ_OK);
    t0 = cq_now_ns();
    CHECK_EQ(cq_put(&r.h, "y", 1, cq_deadline_after(50'000'000)), CQ_FULL);
    dt = cq_now_ns() - t0;
    CHECK(dt >= 50'000'000 && dt < 250'000'000);
    CHECK_EQ(cq_deadline_after(-1), CQ_FOREVER);
}

void test_corruption_detected() {
    Region r(512, 0);
    CHECK_EQ(cq_put(&r.h, "abcdef", 6, CQ_NONBLOCK), CQ_OK);
    // A stored length pointing past the data must be reported, not followed.
    uint32_t bogus = 100000;
    std::memcpy(r.h.ring, &bogus, 4);
    std::string m;
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_ECORRUPT);
    // Random garbage in the state words (after the mutex, which sits at offset 64) never crashes.
    std::mt19937 rng(7);
    const size_t state_begin = 64 + sizeof(pthread_mutex_t);
    for (int i = 0; i < 2000; ++i) {
        uint8_t *p = static_cast<uint8_t *>(r.mem) + state_begin + rng() % 96;
        *p = static_cast<uint8_t>(rng());
        std::vector<uint8_t> out(64);
        size_t n, nbytes, needed;
        const int g = cq_get_records(&r.h, out.data(), out.size(), 4, CQ_NONBLOCK, 0, &n, &nbytes, &needed);
        CHECK(g == CQ_OK || g == CQ_EMPTY || g == CQ_ECORRUPT || g == CQ_BUF_TOO_SMALL);
        if (g == CQ_OK) CHECK(nbytes <= out.size());
        const int p2 = cq_put(&r.h, "z", 1, CQ_NONBLOCK);
        CHECK(p2 == CQ_OK || p2 == CQ_FULL || p2 == CQ_ECORRUPT);
    }
}

void test_dead_lock_holder_recovered() {
    // A producer dies holding the lock, half-way through copying a record: the next locker gets
    // EOWNERDEAD, the half-written record is never delivered and the queue keeps working.
    Region r(4096, 0);
    CHECK_EQ(cq_put(&r.h, "before", 6, CQ_NONBLOCK), CQ_OK);
    std::vector<uint8_t> rec;
    const std::string p = make_payload(1, 1, 200);
    append_record(rec, p.data(), static_cast<uint32_t>(p.size()));
    const pid_t pid = fork();
    if (pid == 0) {
        cq_test_lock_and_partial_put(&r.h, rec.data(), rec.size() / 2);
        _exit(0);  // the kernel's robust-futex list marks the mutex OWNER_DIED
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    std::string m;
    CHECK_EQ(get_one(r.h, &m, cq_deadline_after(1'000'000'000)), CQ_OK);
    CHECK(m == "before");
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_EMPTY);
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 1), CQ_OK);
    CHECK_EQ(st.recoveries, 1);
    CHECK_EQ(cq_put(&r.h, "after", 5, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m == "after");
}

void test_killed_sleeper_does_not_block_others() {
    Region r(4096, 0);
    const pid_t pid = fork();
    if (pid == 0) {
        std::string m;
        get_one(r.h, &m, CQ_FOREVER);  // sleeps on the futex
        _exit(0);
    }
    usleep(50'000);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    CHECK_EQ(cq_put(&r.h, "x", 1, CQ_NONBLOCK), CQ_OK);
    std::string m;
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m == "x");
}

// Wait (up to ~5 s) until stats report `cons` sleeping consumers and `prods` sleeping producers.
bool wait_for_waiters(const cq_handle &h, uint32_t cons, uint32_t prods) {
    for (int i = 0; i < 5000; ++i) {
        cq_stats st;
        if (cq_get_stats(&h, &st, 1) == CQ_OK && st.consumers_waiting == cons && st.producers_waiting == prods)
            return true;
        usleep(1000);
    }
    return false;
}

// Stop `pids` (SIGSTOP) at a moment when stats report `cons` sleeping consumers and `prods` sleeping
// producers, and leave them stopped. A sleeper re-checks the queue every 250 ms (deregisters, relocks, looks,
// registers again) and under load can stay in that gap a while, so a count seen once may be gone by the time
// the test kills them; stopped, they die with the count read. Gives up after ~30 s.
bool freeze_when_waiting(const cq_handle &h, const std::vector<pid_t> &pids, uint32_t cons, uint32_t prods) {
    for (int attempt = 0; attempt < 30; ++attempt) {
        if (!wait_for_waiters(h, cons, prods)) continue;
        for (pid_t pid : pids) kill(pid, SIGSTOP);
        for (pid_t pid : pids) {
            int status = 0;
            waitpid(pid, &status, WUNTRACED);
        }
        cq_stats st;  // (fails if one was stopped holding the queue lock: try again)
        if (cq_get_stats(&h, &st, 1) == CQ_OK && st.consumers_waiting == cons && st.producers_waiting == prods)
            return true;
        for (pid_t pid : pids) kill(pid, SIGCONT);
    }
    return false;
}

// Sleepers SIGKILLed in get and in put are not counted as waiting any more, so that a waker never skips a live sleeper: their robust
// waiter slots are found dead and reaped, and the wake hints follow.
void test_killed_sleepers_are_not_counted() {
    Region r(256, 2);
    std::vector<pid_t> pids;
    for (int i = 0; i < 3; ++i) {  // three consumers asleep on the empty queue
        const pid_t pid = fork();
        if (pid == 0) {
            std::string m;
            get_one(r.h, &m, CQ_FOREVER);
            _exit(0);
        }
        pids.push_back(pid);
    }
    CHECK(freeze_when_waiting(r.h, pids, 3, 0));
    for (pid_t pid : pids) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 1), CQ_OK);
    CHECK_EQ(st.consumers_waiting, 0);
    CHECK_EQ(st.consumers_unwoken, 0);
    CHECK_EQ(st.waiters_reaped, 3);
    // Producers asleep on a full queue (maxsize 2), killed the same way.
    CHECK_EQ(cq_put(&r.h, "a", 1, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(cq_put(&r.h, "b", 1, CQ_NONBLOCK), CQ_OK);
    pids.clear();
    for (int i = 0; i < 2; ++i) {
        const pid_t pid = fork();
        if (pid == 0) {
            cq_put(&r.h, "c", 1, CQ_FOREVER);
            _exit(0);
        }
        pids.push_back(pid);
    }
    CHECK(freeze_when_waiting(r.h, pids, 0, 2));
    for (pid_t pid : pids) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    CHECK_EQ(cq_get_stats(&r.h, &st, 1), CQ_OK);
    CHECK_EQ(st.producers_waiting, 0);
    CHECK_EQ(st.producers_unwoken, 0);
    CHECK_EQ(st.waiters_reaped, 5);
    // Without an explicit check, the next put/get that finds its wake syscall woke nobody asks for the
    // reap itself: a dead sleeper does not make every later operation pay for a wake syscall.
    const pid_t pid = fork();
    if (pid == 0) {
        std::string m;
        get_one(r.h, &m, CQ_FOREVER);  // takes "a"
        get_one(r.h, &m, CQ_FOREVER);  // takes "b"
        get_one(r.h, &m, CQ_FOREVER);  // sleeps
        _exit(0);
    }
    CHECK(freeze_when_waiting(r.h, {pid}, 1, 0));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    usleep(60'000);                                      // (reaps are requested at most every 50 ms)
    CHECK_EQ(cq_put(&r.h, "d", 1, CQ_NONBLOCK), CQ_OK);  // wakes nobody: requests a reap
    std::string m;
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);      // whose lock does it
    CHECK_EQ(cq_get_stats(&r.h, &st, 0), CQ_OK);          // (no reap here)
    CHECK_EQ(st.consumers_waiting, 0);
    CHECK_EQ(st.consumers_unwoken, 0);
    CHECK_EQ(st.waiters_reaped, 6);
}

// A waker killed between its FUTEX_WAKE and its bookkeeping leaves the wake hint too high; it heals as
// soon as the woken sleeper deregisters (the hint is clamped to the registered count).
void test_lost_wake_bookkeeping_heals() {
    Region r(256, 0);
    const pid_t pid = fork();
    if (pid == 0) {
        std::string m;
        _exit(get_one(r.h, &m, cq_deadline_after(5'000'000'000)) == CQ_OK && m == "x" ? 0 : 1);
    }
    // Woken, never taken off the hint. (A wake can find nobody: the sleeper re-checks the queue every 250 ms
    // and may be between two sleeps, still counted. Nothing happens then; try again.)
    long woken = 0;
    for (int i = 0; i < 50 && woken == 0; ++i) {
        CHECK(wait_for_waiters(r.h, 1, 0));
        woken = cq_test_wake_consumers_unaccounted(&r.h);
    }
    CHECK_EQ(woken, 1);
    usleep(20'000);                                            // it re-registers and sleeps again
    CHECK_EQ(cq_put(&r.h, "x", 1, CQ_NONBLOCK), CQ_OK);
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 0), CQ_OK);
    CHECK_EQ(st.consumers_waiting, 0);
    CHECK_EQ(st.consumers_unwoken, 0);
}

// More sleepers than waiter slots: the extra ones sleep unregistered in short polls; all get served.
void test_more_sleepers_than_slots() {
    constexpr int kThreads = CQ_WAIT_SLOTS + 8;
    Region r(1 << 16, 0);
    struct Arg {
        const cq_handle *h;
        std::atomic<int> *got;
    };
    std::atomic<int> got{0};
    Arg arg{&r.h, &got};
    std::vector<pthread_t> threads(kThreads);
    for (auto &t : threads) {
        pthread_create(&t, nullptr, [](void *p) -> void * {
            Arg *a = static_cast<Arg *>(p);
            std::string m;
            if (get_one(*a->h, &m, cq_deadline_after(10'000'000'000)) == CQ_OK) a->got->fetch_add(1);
            return nullptr;
        }, &arg);
    }
    CHECK(wait_for_waiters(r.h, CQ_WAIT_SLOTS, 0));
    usleep(50'000);
    const int64_t t0 = cq_now_ns();
    for (int i = 0; i < kThreads; ++i) CHECK_EQ(cq_put(&r.h, "m", 1, CQ_NONBLOCK), CQ_OK);
    for (auto &t : threads) pthread_join(t, nullptr);
    CHECK_EQ(got.load(), kThreads);
    CHECK(cq_now_ns() - t0 < 2'000'000'000);
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 0), CQ_OK);
    CHECK_EQ(st.consumers_waiting, 0);
    CHECK_EQ(st.consumers_unwoken, 0);
}

// A lock holder that is stopped (SIGSTOP) cannot hold a timed call past its deadline + CQ_LOCK_GRACE_NS;
// once it is killed, the queue recovers.
void test_stopped_lock_holder_bounds_timed_calls() {
    Region r(4096, 0);
    std::vector<uint8_t> rec;
    append_record(rec, "zz", 2);
    const pid_t pid = fork();
    if (pid == 0) {
        cq_test_lock_and_partial_put(&r.h, rec.data(), rec.size());
        raise(SIGSTOP);
        _exit(0);
    }
    int wst = 0;
    waitpid(pid, &wst, WUNTRACED);  // stopped, holding the lock
    CHECK(WIFSTOPPED(wst));
    std::string m;
    int64_t t0 = cq_now_ns();
    CHECK_EQ(get_one(r.h, &m, cq_deadline_after(100'000'000)), CQ_EMPTY);
    int64_t dt = cq_now_ns() - t0;
    CHECK(dt >= 100'000'000 && dt < 100'000'000 + CQ_LOCK_GRACE_NS + 200'000'000);
    t0 = cq_now_ns();
    CHECK_EQ(cq_put(&r.h, "y", 1, CQ_NONBLOCK), CQ_FULL);  // timeout 0: the grace alone
    dt = cq_now_ns() - t0;
    CHECK(dt < CQ_LOCK_GRACE_NS + 200'000'000);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    CHECK_EQ(cq_put(&r.h, "y", 1, CQ_NONBLOCK), CQ_OK);
    CHECK_EQ(get_one(r.h, &m, CQ_NONBLOCK), CQ_OK);
    CHECK(m == "y");
}

// A lock waiter woken by a release but SIGKILLed before it takes the lock takes that wakeup with it; if
// the lock was meanwhile taken through the uncontended path (no FUTEX_WAITERS bit), nobody wakes the other
// waiters again. They must still get the lock soon (lock waits are sliced), even without a deadline.
// Staged with CPU pinning: W1 shares our CPU (it cannot run between its wakeup and its death), N spins on
// trylock on the other CPU and grabs the lock the moment we release it; W2 (no deadline) waits behind W1.
void test_lock_handover_lost_to_killed_waiter() {
    cpu_set_t saved;
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || sched_getaffinity(0, sizeof(saved), &saved) != 0 ||
        !CPU_ISSET(0, &saved) || !CPU_ISSET(1, &saved)) {
        std::printf("  (skipped: needs CPUs 0 and 1)\n");
        return;
    }
    auto pin = [](int cpu) {
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        sched_setaffinity(0, sizeof(s), &s);
    };
    struct Shared {
        std::atomic<int> n_ready, n_locked;
        std::atomic<long long> w2_done_ns;
    };
    void *shm = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shm != MAP_FAILED);
    for (int round = 0; round < 3; ++round) {
        Shared *sh = new (shm) Shared{};
        Region r(4096, 0);
        CHECK_EQ(cq_put(&r.h, "m1", 2, CQ_NONBLOCK), CQ_OK);
        CHECK_EQ(cq_put(&r.h, "m2", 2, CQ_NONBLOCK), CQ_OK);
        pin(0);
        CHECK_EQ(cq_test_lock(&r.h, 0), CQ_OK);
        const pid_t w1 = fork();
        if (w1 == 0) {  // first in line for the lock; shares CPU 0 with us
            std::string m;
            get_one(r.h, &m, CQ_FOREVER);
            _exit(0);
        }
        usleep(20'000);
        const pid_t w2 = fork();
        if (w2 == 0) {
            pin(1);
            std::string m;
            const int g = get_one(r.h, &m, CQ_FOREVER);
            sh->w2_done_ns.store(g == CQ_OK ? cq_now_ns() : -1);
            _exit(0);
        }
        usleep(20'000);
        const pid_t n = fork();
        if (n == 0) {
            pin(1);
            sh->n_ready.store(1);
            while (cq_test_lock(&r.h, 1) != CQ_OK) {
            }
            sh->n_locked.store(1);
            usleep(2'000);
            cq_test_unlock(&r.h);
            _exit(0);
        }
        while (!sh->n_ready.load()) {
        }
        usleep(1'000);
        cq_test_unlock(&r.h);  // wakes W1
        for (int spin = 0; !sh->n_locked.load() && spin < 100'000'000; ++spin) {
        }
        kill(w1, SIGKILL);  // before it could run: its wakeup is lost
        sched_setaffinity(0, sizeof(saved), &saved);
        waitpid(w1, nullptr, 0);
        waitpid(n, nullptr, 0);
        const int64_t t0 = cq_now_ns();
        while (sh->w2_done_ns.load() == 0 && cq_now_ns() - t0 < 2'000'000'000) usleep(1'000);
        const long long done = sh->w2_done_ns.load();
        CHECK(done > 0);  // the old code left W2 blocked for good here (with a message queued)
        if (done <= 0) kill(w2, SIGKILL);
        waitpid(w2, nullptr, 0);
    }
    munmap(shm, sizeof(Shared));
}

void test_blocking_wakeup_across_processes() {
    Region r(256, 0);
    const pid_t pid = fork();
    if (pid == 0) {
        usleep(100'000);
        _exit(cq_put(&r.h, "late", 4, CQ_FOREVER) == CQ_OK ? 0 : 1);
    }
    std::string m;
    const int64_t t0 = cq_now_ns();
    CHECK_EQ(get_one(r.h, &m, CQ_FOREVER), CQ_OK);
    CHECK(m == "late");
    CHECK(cq_now_ns() - t0 < 1'000'000'000);  // woken by the put, not by the safety-net recheck chain
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
}

// Producers in several processes, consumer here: nothing lost, nothing duplicated, order per producer.
void test_multiprocess_stress() {
    constexpr int kProducers = 3;
    constexpr uint32_t kPerProducer = 60000;
    Region r(1 << 14, 0);
    std::vector<pid_t> pids;
    for (int p = 0; p < kProducers; ++p) {
        const pid_t pid = fork();
        if (pid == 0) {
            std::mt19937 rng(p);
            uint32_t seq = 0;
            while (seq < kPerProducer) {
                std::vector<uint8_t> batch;
                const uint32_t k = std::min<uint32_t>(1 + rng() % 16, kPerProducer - seq);
                for (uint32_t i = 0; i < k; ++i) {
                    const std::string s = make_payload(p, seq + i, 12 + rng() % 40);
                    append_record(batch, s.data(), static_cast<uint32_t>(s.size()));
                }
                if (cq_put_records(&r.h, batch.data(), batch.size(), k, CQ_FOREVER, 0) != CQ_OK) _exit(1);
                seq += k;
            }
            _exit(0);
        }
        pids.push_back(pid);
    }
    std::vector<uint32_t> next(kProducers, 0);
    std::vector<uint8_t> out(1 << 14);
    uint64_t total = 0, bad = 0;
    while (total < uint64_t(kProducers) * kPerProducer) {
        size_t n, nbytes, needed;
        const int g = cq_get_records(&r.h, out.data(), out.size(), 1 << 20, cq_deadline_after(5'000'000'000), 0,
                                     &n, &nbytes, &needed);
        if (g != CQ_OK) {
            CHECK_EQ(g, CQ_OK);
            break;
        }
        for (const std::string &s : split_records(out, nbytes)) {
            uint32_t prod, seq;
            if (!payload_intact(s, &prod, &seq) || prod >= kProducers || seq != next[prod]) {
                ++bad;
                continue;
            }
            ++next[prod];
            ++total;
        }
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(total, uint64_t(kProducers) * kPerProducer);
    for (pid_t pid : pids) {
        int wst = 0;
        waitpid(pid, &wst, 0);
        CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    }
}

// Producers SIGKILLed at random moments while copying big batches: every delivered record is intact,
// each producer's records arrive as a gap-free prefix, and the consumer never stalls. The consumer is a
// separate process: if the killer were the consumer, a producer sharing its core would mostly be
// preempted right after unlocking (when it wakes the consumer), and kills would rarely hit the lock.
void test_sigkill_producers() {
    constexpr uint32_t kMaxProducers = 2000;
    struct Shared {
        std::atomic<int> stop;
        std::atomic<uint64_t> delivered, bad;
    };
    Region r(1 << 20, 0);
    void *shm = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shm != MAP_FAILED);
    Shared *sh = new (shm) Shared{};
    const pid_t consumer = fork();
    if (consumer == 0) {
        std::vector<uint8_t> out(1 << 20);
        std::vector<uint32_t> next(kMaxProducers, 0);
        for (;;) {
            size_t n, nbytes, needed;
            const int g = cq_get_records(&r.h, out.data(), out.size(), 1 << 20, cq_deadline_after(20'000'000), 0, &n,
                                         &nbytes, &needed);
            if (g == CQ_EMPTY && sh->stop.load()) _exit(0);
            if (g != CQ_OK) continue;
            for (size_t off = 0; off < nbytes;) {
                uint32_t len, p, seq;
                std::memcpy(&len, out.data() + off, 4);
                // Every 8th record byte by byte, the others sampled: the consumer must outpace the
                // producers, or they sleep on a full ring instead of being killed mid-copy.
                const uint32_t stride = (sh->delivered.load(std::memory_order_relaxed) % 8) ? 61 : 1;
                if (!record_intact(out.data() + off + CQ_RECORD_HEADER, len, &p, &seq, stride) ||
                    p >= kMaxProducers || seq != next[p])
                    sh->bad.fetch_add(1);
                else
                    ++next[p];
                sh->delivered.fetch_add(1);
                off += CQ_RECORD_HEADER + len;
            }
        }
    }
    // Kill at least 30 producers, and go on (up to kMaxProducers) until a kill has landed while the lock
    // was held: where a kill lands is chance (about 1 kill in 100 here, 1 in 300 at worst on a busy
    // machine), but the recovery path must have been exercised under load; dead_lock_holder_recovered
    // covers it deterministically.
    // Even-numbered producers block on a full ring (killed mid-copy or asleep); odd-numbered ones retry
    // non-blocking puts, taking the lock on every try, so that kills under the lock stay frequent even
    // when a busy machine lets the consumer fall behind and the ring stays full.
    std::mt19937 rng(3);
    uint32_t kills = 0;
    for (uint32_t prod = 0; prod < kMaxProducers; ++prod) {
        cq_stats so_far;
        if (prod >= 30 && cq_get_stats(&r.h, &so_far, 1) == CQ_OK && so_far.recoveries >= 1) break;
        ++kills;
        const pid_t pid = fork();
        if (pid == 0) {
            // Build each batch in place (the same bytes as make_payload, without allocations): the
            // producer's time then goes mostly to the copy under the lock.
            constexpr uint32_t kLen = 8000, kRec = CQ_RECORD_HEADER + kLen, kBatch = 32;
            std::vector<uint8_t> batch(kBatch * kRec);
            for (uint32_t seq = 0;; seq += kBatch) {
                for (uint32_t i = 0; i < kBatch; ++i) {
                    uint8_t *rec = batch.data() + i * kRec, *pl = rec + CQ_RECORD_HEADER;
                    const uint32_t sq = seq + i, check = prod * 2654435761u ^ sq * 40503u ^ kLen;
                    std::memcpy(rec, &kLen, 4);
                    std::memset(pl, static_cast<int>((prod * 7u + sq * 13u) & 0xff), kLen);
                    std::memcpy(pl, &prod, 4);
                    std::memcpy(pl + 4, &sq, 4);
                    std::memcpy(pl + kLen - 4, &check, 4);
                }
                if (prod % 2 == 0) {
                    cq_put_records(&r.h, batch.data(), batch.size(), kBatch, CQ_FOREVER, 0);
                } else {
                    while (cq_put_records(&r.h, batch.data(), batch.size(), kBatch, CQ_NONBLOCK, 0) == CQ_FULL) {
                    }
                }
            }
        }
        usleep(2000 + rng() % 8000);
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    sh->stop.store(1);
    int wst = 0;
    waitpid(consumer, &wst, 0);  // a deadlocked consumer would hang here (pytest's timeout reports it)
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    cq_stats st;
    CHECK_EQ(cq_get_stats(&r.h, &st, 1), CQ_OK);
    std::printf("  sigkill test: %u producers killed, %llu records delivered, %llu lock-holder recoveries\n", kills,
                static_cast<unsigned long long>(sh->delivered.load()), static_cast<unsigned long long>(st.recoveries));
    CHECK_EQ(sh->bad.load(), 0);
    CHECK(sh->delivered.load() > 0);
    CHECK(st.recoveries >= 1);
    CHECK_EQ(st.count, 0);
    CHECK_EQ(cq_put(&r.h, "ok", 2, CQ_NONBLOCK), CQ_OK);
    munmap(shm, sizeof(Shared));
}

}  // namespace

int main() {
    struct {
        const char *name;
        void (*fn)();
    } tests[] = {
        {"basic_fifo", test_basic_fifo},
        {"wraparound_and_batches", test_wraparound_and_batches},
        {"limits_and_errors", test_limits_and_errors},
        {"timeouts", test_timeouts},
        {"corruption_detected", test_corruption_detected},
        {"dead_lock_holder_recovered", test_dead_lock_holder_recovered},
        {"killed_sleeper_does_not_block_others", test_killed_sleeper_does_not_block_others},
        {"killed_sleepers_are_not_counted", test_killed_sleepers_are_not_counted},
        {"lost_wake_bookkeeping_heals", test_lost_wake_bookkeeping_heals},
        {"more_sleepers_than_slots", test_more_sleepers_than_slots},
        {"stopped_lock_holder_bounds_timed_calls", test_stopped_lock_holder_bounds_timed_calls},
        {"lock_handover_lost_to_killed_waiter", test_lock_handover_lost_to_killed_waiter},
        {"blocking_wakeup_across_processes", test_blocking_wakeup_across_processes},
        {"multiprocess_stress", test_multiprocess_stress},
        {"sigkill_producers", test_sigkill_producers},
    };
    for (const auto &t : tests) {
        const int before = g_failures;
        t.fn();
        std::printf("%s %s\n", g_failures == before ? "PASS" : "FAIL", t.name);
    }
    std::printf("%s (%d failed checks)\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
    return g_failures ? 1 : 0;
}
