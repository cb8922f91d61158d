// The SSD store's I/O threads; see thread_pool.h.
#include "store/thread_pool.h"

#include <atomic>
#include <memory>

namespace saria_store {

ThreadPool::ThreadPool(int n) {
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::submit(std::function<void()> f, bool urgent) {
  {
    std::lock_guard<std::mutex> g(m_);
    (urgent ? urgent_ : q_).push_back(std::move(f));
  }
  cv_.notify_one();
}

bool ThreadPool::pop(std::function<void()>& f, bool urgent_only) {
  auto& q = !urgent_.empty() ? urgent_ : q_;
  if (q.empty() || (urgent_only && &q != &urgent_)) return false;
  f = std::move(q.front());
  q.pop_front();
  return true;
}

bool ThreadPool::try_run_one(bool urgent_only) {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> g(m_);
    if (!pop(f, urgent_only)) return false;
  }
  f();
  return true;
}

void ThreadPool::loop() {
  for (;;) {
    std::function<void()> f;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty() || !urgent_.empty(); });
      if (!pop(f, false)) return;
    }
    f();
  }
}

void run_all(ThreadPool* pool, std::vector<std::function<void()>>& tasks, bool urgent) {
  if (tasks.empty()) return;
  if (tasks.size() == 1 || pool == nullptr) {
    for (auto& t : tasks) t();
    return;
  }
  struct Latch {
    std::atomic<size_t> left;
    std::mutex m;
    std::condition_variable cv;
  };
  auto latch = std::make_shared<Latch>();
  latch->left = tasks.size();
  for (auto& t : tasks) {
    pool->submit([latch, f = std::move(t)] {
      f();
      if (latch->left.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> g(latch->m);
        latch->cv.notify_all();
      }
    }, urgent);
  }
  // The caller works too, then waits for the tasks the workers took.
  while (latch->left.load() > 0 && pool->try_run_one(urgent)) {
  }
  std::unique_lock<std::mutex> lk(latch->m);
  latch->cv.wait(lk, [&] { return latch->left.load() == 0; });
}

}  // namespace saria_store
