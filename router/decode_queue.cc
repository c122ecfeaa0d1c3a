#include "router/decode_queue.h"

namespace tandem::router {

DecodeQueue::DecodeQueue(Executor* executor, absl::Duration retry_interval)
    : executor_(executor), retry_interval_(retry_interval) {}

DecodeQueue::~DecodeQueue() { Stop(); }

void DecodeQueue::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  // A timer already running holds the queue weakly and arms no other.
  if (retry_timer_ != 0) executor_->CancelTimer(retry_timer_);
  retry_timer_ = 0;
}

uint64_t DecodeQueue::NextPosition() {
  absl::MutexLock lock(&mu_);
  return next_position_++;
}

void DecodeQueue::Park(int priority, uint64_t position, std::function<void()> wake) {
  std::function<void()> replaced;  // Destroyed after the lock is released.
  absl::MutexLock lock(&mu_);
  if (auto it = priority_of_.find(position); it != priority_of_.end()) {
    auto old = parked_.find(Key(-it->second, position));
    replaced = std::move(old->second);
    parked_.erase(old);
  }
  priority_of_[position] = priority;
  parked_[Key(-priority, position)] = std::move(wake);
  ArmRetryLocked();
}

bool DecodeQueue::Remove(uint64_t position) {
  // What the wake holds (the request's driver) goes outside the lock.
  std::function<void()> removed;
  absl::MutexLock lock(&mu_);
  auto it = priority_of_.find(position);
  if (it == priority_of_.end()) return false;
  auto parked = parked_.find(Key(-it->second, position));
  removed = std::move(parked->second);
  parked_.erase(parked);
  priority_of_.erase(it);
  return true;
}

void DecodeQueue::WakeOne() {
  std::function<void()> wake;
  {
    absl::MutexLock lock(&mu_);
    if (parked_.empty()) return;
    auto first = parked_.begin();
    priority_of_.erase(first->first.second);
    wake = std::move(first->second);
    parked_.erase(first);
  }
  wake();
}

int DecodeQueue::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(parked_.size());
}

void DecodeQueue::ArmRetryLocked() {
  if (stopped_ || retry_timer_ != 0 || parked_.empty()) return;
  retry_timer_ =
      executor_->PostAt(executor_->clock().Now() + retry_interval_, [weak = weak_from_this()] {
        if (std::shared_ptr<DecodeQueue> self = weak.lock()) {
          self->OnRetryTimer();
        }
      });
}

void DecodeQueue::OnRetryTimer() {
  {
    absl::MutexLock lock(&mu_);
    retry_timer_ = 0;
  }
  WakeOne();
  absl::MutexLock lock(&mu_);
  ArmRetryLocked();
}

}  // namespace tandem::router
