// The SSD store's I/O threads: a fixed pool with two queues, and a helper
// that runs a batch of tasks on it with the caller working too.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace saria_store {

class ThreadPool {
 public:
  explicit ThreadPool(int n);
  ~ThreadPool();
  // Two queues: urgent tasks (reads, which an engine waits for) are taken
  // before normal ones (writes, which run in the background), so a read never
  // queues behind a large write batch already in the pool.
  void submit(std::function<void()> f, bool urgent = false);
  // Run one queued task in the caller; false if none. An urgent caller only
  // helps with urgent tasks, so it never picks up a write chunk.
  bool try_run_one(bool urgent_only = false);

 private:
  void loop();
  bool pop(std::function<void()>& f, bool urgent_only);  // caller holds m_
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_, urgent_;
  bool stop_ = false;
};

// Runs every task and returns when all are done: on `pool` (if any and if
// there is more than one task), the calling thread helping with the queue.
void run_all(ThreadPool* pool, std::vector<std::function<void()>>& tasks, bool urgent = false);

}  // namespace saria_store
