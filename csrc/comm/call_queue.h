// The communicator's queue of issued calls: a FIFO on a ring of slots that
// grows by doubling and never shrinks. A queued call is a few hundred bytes,
// so std::deque gave each its own node: an allocation and a free per async
// call, on the path that a small async_op=True + wait() takes.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ringcomm {

template <typename T>
class CallQueue {
 public:
  bool empty() const { return n_ == 0; }
  size_t size() const { return n_; }
  T& front() { return ring_[head_]; }
  const T& front() const { return ring_[head_]; }
  template <typename... Args>
  void emplace_back(Args&&... args) {
    if (n_ == ring_.size()) grow();
    ring_[(head_ + n_) & (ring_.size() - 1)] = T(std::forward<Args>(args)...);
    ++n_;
  }
  // Leaves the slot empty (T()): what it held (a Work) is released now.
  void pop_front() {
    ring_[head_] = T();
    head_ = (head_ + 1) & (ring_.size() - 1);
    --n_;
  }

  template <typename Q, typename V>
  class Iter {
   public:
    Iter(Q* q, size_t i) : q_(q), i_(i) {}
    V& operator*() const { return q_->ring_[(q_->head_ + i_) & (q_->ring_.size() - 1)]; }
    V* operator->() const { return &**this; }
    Iter& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iter& o) const { return i_ != o.i_; }

   private:
    Q* q_;
    size_t i_;
  };
  Iter<CallQueue, T> begin() { return {this, 0}; }
  Iter<CallQueue, T> end() { return {this, n_}; }
  Iter<const CallQueue, const T> begin() const { return {this, 0}; }
  Iter<const CallQueue, const T> end() const { return {this, n_}; }

 private:
  void grow() {
    std::vector<T> bigger(ring_.empty() ? 8 : 2 * ring_.size());
    for (size_t i = 0; i < n_; ++i) bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
    ring_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> ring_;  // a power of two slots
  size_t head_ = 0;
  size_t n_ = 0;
};

}  // namespace ringcomm
