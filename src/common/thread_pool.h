// A persistent pool of worker threads for data-parallel loops. Workers are created once; between
// jobs they spin briefly on an atomic job counter (a decode step issues hundreds of small jobs,
// and waking a sleeping thread costs more than the job) and then sleep on a condition variable.
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
  // thread 0) and returns when all have finished. Not reentrant.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks (multiples of `grain`, except the last) and runs
  // fn(begin, end) for each on the pool.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};  // bumped once per job
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  const std::function<void(int, int)>* job_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  int sleepers_ = 0;  // guarded by mu_
};

// Number of threads to use when the user did not say: the cores we may run on.
int default_thread_count();

}  // namespace tandem
