// A persistent pool of worker threads for data-parallel loops. Workers are created once and
// sleep between jobs, so a decode step never pays for thread creation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // n_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, n_threads) once on each of the n_threads threads (the caller is
  // thread 0) and returns when all have finished.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks (multiples of `grain`, except the last) and runs
  // fn(begin, end) for each on the pool.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(int, int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Number of threads to use when the user did not say: the physical cores we may run on.
int default_thread_count();

}  // namespace tandem
