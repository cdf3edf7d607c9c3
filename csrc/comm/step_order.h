// The order in which a rank runs the Steps of a Schedule (algo/step.h), kept
// in one place for the two that need it: the executor (comm/executor.cpp),
// which moves data, and the plan checker (testing/plan_check.cpp), which runs
// every rank's schedule of a call against modelled FIFOs to prove it
// completes. Whatever order the executor may take, the checker takes too.
//
// The rules: a step may touch a FIFO only if no earlier incomplete step uses
// it (messages on a FIFO stay in list order); a step whose `after` is not
// complete waits, holding its FIFOs' place; pull steps use no FIFO and do
// not wait for other steps; a local step runs only when everything before it
// is complete (also when they completed earlier in the same pass), and
// nothing after it starts before it is.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/step.h"

namespace ringcomm {

// How far a run has got with one Step. The runner owns one per step (a
// vector it reuses from call to call); the Schedule stays untouched.
struct StepProgress {
  size_t done = 0;       // bytes moved
  uint64_t segment = 0;  // segments moved: the number of the next one
  bool complete = false;
  uint64_t ticket = 0;   // the last segment sent by reference (Link::send_ref), 0: none
  bool posted = false;   // the rest is posted to land in place (Link::post_recv)
  size_t landed = 0;     // ... and this much of it has (as posted() last said)
  size_t fwd = 0;        // kRecvCopySend: bytes sent on (trails `done` while segments land in place)
  uint64_t fwd_segment = 0;
};

// Steps beyond the first incomplete one that a pass looks at. The FIFO order
// rule blocks anything further anyway; this bounds the cost of a pass.
inline size_t step_window(int world) { return static_cast<size_t>(4 * world + 8); }

// Busy marks of one pass: per peer, whether an earlier incomplete step holds
// the FIFO to it (send) or from it (recv). Sized to the world once.
struct FifoMarks {
  std::vector<uint8_t> send, recv;
  bool any = false;  // a mark was set since the last clear (most passes set none)
  explicit FifoMarks(int world = 0) : send(world), recv(world) {}
  void mark(const Step& s) {
    if (uses_recv(s.kind)) recv[s.recv_peer] = 1;
    if (uses_send(s.kind)) send[s.send_peer] = 1;
    any = true;
  }
  void clear() {
    if (!any) return;
    std::fill(send.begin(), send.end(), 0);
    std::fill(recv.begin(), recv.end(), 0);
    any = false;
  }
};

// One pass over steps[*first, *first + window): calls `advance(i)` (which
// moves step i as far as it can, updates progress[i] and returns whether
// anything moved) for every step the rules let move now, then moves *first
// past the complete prefix. Returns whether anything moved. `progress`
// holds at least steps.size() entries.
template <class Advance>
bool ordered_pass(const Schedule& steps, StepProgress* progress, size_t* first, size_t window, FifoMarks& busy,
                  Advance&& advance) {
  busy.clear();
  bool moved = false;
  // Whether every step before i is complete (those this pass completed too):
  // a local step runs then, and the steps after it may start in this pass.
  bool prefix_done = true;
  const size_t end = std::min(steps.size(), *first + window);
  for (size_t i = *first; i < end; ++i) {
    const Step& s = steps[i];
    if (progress[i].complete) continue;
    if (is_local(s.kind)) {
      if (prefix_done) moved |= advance(i);
      if (!progress[i].complete) break;
      continue;
    }
    if (s.after != SIZE_MAX && !progress[s.after].complete) {
      // Not ready: still holds its FIFOs' place so later messages stay behind it.
      busy.mark(s);
      prefix_done = false;
      continue;
    }
    if (is_pull(s.kind)) {
      moved |= advance(i);
      prefix_done = prefix_done && progress[i].complete;
      continue;
    }
    const bool rb = uses_recv(s.kind) && busy.recv[s.recv_peer];
    const bool sb = uses_send(s.kind) && busy.send[s.send_peer];
    if (!rb && !sb) moved |= advance(i);
    if (!progress[i].complete) {
      busy.mark(s);
      prefix_done = false;
    }
  }
  while (*first < steps.size() && progress[*first].complete) ++*first;
  return moved;
}

}  // namespace ringcomm
