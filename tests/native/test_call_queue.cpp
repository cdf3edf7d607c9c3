// comm/call_queue.h: the communicator's FIFO of issued calls keeps issue
// order across wrap-around and growth, and a popped slot lets go of what it
// held (the Work of a queued call) at once.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "comm/call_queue.h"

using namespace ringcomm;

namespace {
using Item = std::pair<int, std::shared_ptr<int>>;
}  // namespace

NATIVE_TEST(call_queue, keeps_order_through_wrap_and_growth) {
  CallQueue<Item> q;
  CHECK(q.empty());
  int next_in = 0, next_out = 0;
  // Pushes and pops interleaved so that the head walks round the ring while
  // it grows (8, 16, 32 slots): every pattern of wrap at every size.
  for (int round = 0; round < 200; ++round) {
    const int push = 1 + round % 7, pop = round % 5;
    for (int i = 0; i < push; ++i) q.emplace_back(next_in, std::make_shared<int>(next_in)), ++next_in;
    for (int i = 0; i < pop && !q.empty(); ++i) {
      CHECK_EQ(q.front().first, next_out);
      CHECK_EQ(*q.front().second, next_out);
      q.pop_front();
      ++next_out;
    }
    CHECK_EQ(q.size(), size_t(next_in - next_out));
    int expect = next_out;
    for (const Item& it : static_cast<const CallQueue<Item>&>(q)) CHECK_EQ(it.first, expect++);
    CHECK_EQ(expect, next_in);
  }
  while (!q.empty()) {
    CHECK_EQ(q.front().first, next_out++);
    q.pop_front();
  }
  CHECK_EQ(next_out, next_in);
}

NATIVE_TEST(call_queue, pop_releases_the_slot) {
  CallQueue<Item> q;
  auto held = std::make_shared<int>(7);
  std::weak_ptr<int> watch = held;
  q.emplace_back(1, std::move(held));
  q.emplace_back(2, std::make_shared<int>(8));
  for (auto& it : q) it.first += 10;  // the mutable iteration reaches the slots
  CHECK_EQ(q.front().first, 11);
  q.pop_front();
  CHECK(watch.expired());  // not kept alive by the emptied slot
  CHECK_EQ(q.front().first, 12);
}
