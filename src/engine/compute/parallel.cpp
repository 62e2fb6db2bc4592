#include "engine/compute/parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "veloxquant/errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VQ_PAUSE() _mm_pause()
#else
#define VQ_PAUSE() ((void)0)
#endif

namespace vq::engine {
namespace {

constexpr int kSpin = 4000;  // pause iterations (a few microseconds) before sleeping

thread_local bool in_parallel = false;

class Pool {
 public:
  explicit Pool(int n_workers) {
    for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { work(i + 1); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int size() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  void run(std::int64_t n, int T, detail::RangeFn fn, void* ctx) {
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    T_ = T;
    remaining_.store(size() - 1);  // every worker acknowledges every loop
    {
      std::lock_guard<std::mutex> lk(m_);
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    in_parallel = true;
    fn(ctx, 0, n / T);
    in_parallel = false;
    for (int i = 0; remaining_.load() != 0; ++i) {
      if (i < kSpin) {
        VQ_PAUSE();
        continue;
      }
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [this] { return remaining_.load() == 0; });
    }
  }

 private:
  void work(int t) {
    in_parallel = true;
    std::uint64_t seen = 0;
    for (;;) {
      for (int i = 0; gen_.load() == seen && i < kSpin; ++i) VQ_PAUSE();
      if (gen_.load() == seen) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
      }
      seen = gen_.load();
      if (stop_) return;
      if (t < T_) fn_(ctx_, n_ * t / T_, n_ * (t + 1) / T_);
      if (remaining_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lk(m_);
        done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<int> remaining_{0};
  bool stop_ = false;
  // The current loop (written before gen_ is bumped under the mutex, read after).
  detail::RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t n_ = 0;
  int T_ = 1;
};

struct State {
  std::mutex m;
  int threads = available_cores();
  std::unique_ptr<Pool> pool;
};
State& state() {
  static State s;
  return s;
}

}  // namespace

int available_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

void set_threads(int n) {
  if (n < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "[engine] threads must be >= 1, got " + std::to_string(n));
  }
  State& s = state();
  std::lock_guard<std::mutex> lk(s.m);
  s.threads = n;
}

int threads() noexcept { return state().threads; }

namespace detail {
void run_parallel(std::int64_t n, int n_threads, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  const int T = static_cast<int>(std::min<std::int64_t>(n, n_threads < 1 ? 1 : n_threads));
  if (T == 1 || in_parallel) {
    fn(ctx, 0, n);
    return;
  }
  State& s = state();
  std::lock_guard<std::mutex> lk(s.m);  // one loop at a time
  if (!s.pool || s.pool->size() < T) {
    s.pool.reset();
    s.pool = std::make_unique<Pool>(T - 1);
  }
  s.pool->run(n, T, fn, ctx);
}
}  // namespace detail

}  // namespace vq::engine
