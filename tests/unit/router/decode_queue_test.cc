// The DecodeQueue's bookkeeping on a ManualExecutor: who is woken first,
// that a re-parked request keeps its place, that removed requests are not
// woken, and the retry timer that runs only while someone waits.
#include "router/decode_queue.h"

#include <memory>
#include <vector>

#include "common/base/clock.h"
#include "common/base/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class DecodeQueueTest : public ::testing::Test {
 protected:
  // Parks a request named `name` that records its wake in woken_.
  uint64_t Park(int priority, int name) {
    const uint64_t position = queue_->NextPosition();
    ParkAt(priority, position, name);
    return position;
  }
  void ParkAt(int priority, uint64_t position, int name) {
    queue_->Park(priority, position, [this, name] { woken_.push_back(name); });
  }

  FakeClock clock_;
  ManualExecutor executor_{&clock_};
  std::shared_ptr<DecodeQueue> queue_ =
      std::make_shared<DecodeQueue>(&executor_, absl::Milliseconds(200));
  std::vector<int> woken_;
};

TEST_F(DecodeQueueTest, WakesLargerPriorityFirstThenInArrivalOrder) {
  Park(0, 1);
  Park(0, 2);
  Park(5, 3);
  Park(-1, 4);
  Park(5, 5);
  EXPECT_EQ(queue_->waiting(), 5);
  for (int i = 0; i < 6; ++i) queue_->WakeOne();
  EXPECT_THAT(woken_, ElementsAre(3, 5, 1, 2, 4));
  EXPECT_EQ(queue_->waiting(), 0);
}

TEST_F(DecodeQueueTest, AReparkedRequestKeepsItsPlaceAndARemovedOneIsNotWoken) {
  const uint64_t first = Park(0, 1);
  const uint64_t second = Park(0, 2);
  Park(0, 3);
  queue_->WakeOne();
  EXPECT_THAT(woken_, ElementsAre(1));
  // Refused again: back at the front, ahead of those that came later.
  ParkAt(0, first, 1);
  EXPECT_TRUE(queue_->Remove(second));
  EXPECT_FALSE(queue_->Remove(second));
  queue_->WakeOne();
  queue_->WakeOne();
  EXPECT_THAT(woken_, ElementsAre(1, 1, 3));
  // Parking an already parked position replaces it rather than adding one.
  const uint64_t p = Park(0, 4);
  ParkAt(0, p, 5);
  EXPECT_EQ(queue_->waiting(), 1);
  queue_->WakeOne();
  EXPECT_THAT(woken_, ElementsAre(1, 1, 3, 5));
}

TEST_F(DecodeQueueTest, TheRetryTimerWakesOneAtATimeOnlyWhileSomeoneWaits) {
  EXPECT_EQ(executor_.pending(), 0u);
  const absl::Time start = clock_.Now();
  Park(0, 1);
  Park(0, 2);
  EXPECT_EQ(executor_.pending(), 1u);  // One timer for the queue.
  executor_.RunUntil(start + absl::Milliseconds(199));
  EXPECT_THAT(woken_, IsEmpty());
  executor_.RunUntil(start + absl::Milliseconds(200));
  EXPECT_THAT(woken_, ElementsAre(1));
  executor_.RunUntil(start + absl::Milliseconds(400));
  EXPECT_THAT(woken_, ElementsAre(1, 2));
  // Nobody left: the timer stops.
  executor_.RunUntil(start + absl::Seconds(10));
  EXPECT_EQ(executor_.pending(), 0u);
  EXPECT_THAT(woken_, ElementsAre(1, 2));
}

TEST_F(DecodeQueueTest, ATimerDueAfterTheQueueIsGoneDoesNothing) {
  Park(0, 1);
  queue_.reset();
  executor_.RunUntil(clock_.Now() + absl::Seconds(1));
  EXPECT_THAT(woken_, IsEmpty());
}

}  // namespace
}  // namespace tandem::router
