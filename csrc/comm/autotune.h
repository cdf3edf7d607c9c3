// `auto` checked against the calls' own times (RINGCOMM_AUTOTUNE, on by
// default on the CPU): the cost model picks, and the tuner notices when calls
// run far from what it predicted, then measures the candidates and keeps the
// fastest, and measures again when the machine changes under it (load comes
// or goes, as on a shared host: the links measured at init carry the load of
// that moment). After the autotuning of Open MPI's coll/tuned and NCCL's
// tuner plugins, but online and agreed, so that every rank picks alike.
//
// Per call signature (op, size as the cost model counts it), the same on
// every rank since all ranks issue the same collectives in the same order:
//   model    runs the model's pick; at its check (after 5 calls, then every
//            ~0.25 s of calls) the ranks agree on the slowest rank's median
//            time of the last calls; within 1.3x of the prediction (either
//            way) it stays, otherwise it explores;
//   explore  runs each other candidate for 3 calls; after each, the ranks
//            agree on its median (the slowest rank's); the fastest is kept;
//   tuned    runs the kept pick; at its check, a median within 1.3x of the
//            one it was kept with stays, otherwise it explores again (the
//            current pick first). An exploration that keeps the same pick
//            doubles the time to the next check (up to 8x), so a noisy
//            machine does not explore over and over.
// Each agreement is the dissemination minimum of agree_on_call (log2 n
// rounds of 16 bytes) run inside the call whose time completes a window, so
// every rank changes its pick between the same two calls. A call's time is
// this rank's, from its start (after planning) to the end of its schedule;
// between checks a call is only counted, the last kWindow calls before a
// check (and every exploring call) are timed.
//
// Off (RINGCOMM_AUTOTUNE=0): `auto` is the model's pick for the call's size,
// always; a run's picks then depend only on the model, which a training run
// that wants the same reduction order on every run (floating-point sums of
// three or more ranks round by order) may prefer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/chooser.h"

namespace ringcomm {

class AutoTuner {
 public:
  enum class State : uint8_t { kOff, kModel, kExplore, kTuned };

  // What one signature's tuning stands at (Communicator::tuning).
  struct Report {
    OpKind kind;
    size_t bytes;
    State state;
    Algo pick;        // what it runs now
    Algo model_pick;  // what the model picks
    double predicted;   // the model's seconds for model_pick
    double reference;   // tuned: the agreed median the pick was kept with (seconds); else NaN
    uint32_t explorations;
    std::vector<std::pair<Algo, double>> measured;  // the last exploration: agreed median per candidate
  };

  static const char* state_name(State s);

  void enable(bool on) { on_ = on; }
  // Forgets every signature (the model changed: its predictions are new).
  void reset();
  bool on() const { return on_; }

  // The family to run for a call of this signature: kAuto for the model's
  // pick (model state, untuned, or off).
  Algo override_for(OpKind kind, size_t bytes) const;

  // After a call of this signature ran: whether record() wants its time.
  // Cheap (no clock): in the model and tuned states only the last calls
  // of a window are timed, the others only counted.
  bool wants_time(OpKind kind, size_t bytes);
  // After a call ran `seconds` on this rank (wants_time said so). Returns true when the ranks
  // must now agree: *word is this rank's figure (minus nanoseconds, so that
  // the ranks' minimum is minus the slowest rank's), to be handed to
  // agreed(). `candidates` lists the call's candidates, the model's pick
  // first (asked once per signature and each exploration).
  bool record(OpKind kind, size_t bytes, double seconds, int64_t* word,
              const std::function<std::vector<Candidate>()>& candidates);
  // The agreed figure (the minimum of every rank's *word). Returns true when
  // the pick of this signature changed (plans memoised for it must go).
  bool agreed(OpKind kind, size_t bytes, int64_t min_word);

  // Every signature tuned or being tuned (not the kOff ones), and one.
  std::vector<Report> report() const;
  bool report_of(OpKind kind, size_t bytes, Report* out) const;

  // Tuning limits (public for the tests' arithmetic).
  static constexpr double kBand = 1.3;             // within this ratio either way: no change
  static constexpr uint32_t kFirstCheck = 5;       // calls before a signature's first check
  static constexpr uint32_t kSamples = 3;          // calls per explored candidate
  static constexpr double kCheckSeconds = 0.25;    // calls between checks: about this long
  static constexpr uint32_t kMaxBackoff = 8;
  static constexpr size_t kMaxSignatures = 4096;   // beyond: untuned (the model's pick)
  static constexpr uint32_t kWindow = 8;           // timed calls a check takes the median of

 private:
  struct Slot {
    State state = State::kOff;
    Algo pick = Algo::kAuto;
    std::vector<Candidate> cands;  // the model's order; exploring: the pick of the time first, cands[cand] runs
    size_t cand = 0;
    Algo model_pick = Algo::kAuto;
    double predicted = 0;  // the model's seconds for model_pick
    double reference = 0;
    Algo best = Algo::kAuto;
    double best_seconds = 0;
    uint32_t calls = 0;      // since the window began
    uint32_t sampled = 0;    // of them timed (the last ones before the check)
    uint32_t interval = kFirstCheck;
    uint32_t backoff = 1;
    uint32_t explorations = 0;
    std::vector<std::pair<Algo, double>> measured;
    float window[kWindow] = {};
  };
  static uint64_t key_of(OpKind kind, size_t bytes) { return (uint64_t(kind) << 56) ^ uint64_t(bytes); }
  Slot* find(uint64_t key) const;
  void start_exploring(Slot& s, double current_seconds);
  static uint32_t interval_for(double seconds, uint32_t backoff);
  static double median(const Slot& s);

  bool on_ = false;
  // Written by the thread running calls (one at a time), read by report()
  // from any thread: mu_ guards the map's shape and the slots' reports.
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Slot> slots_;
  mutable uint64_t last_key_ = ~0ull;
  mutable Slot* last_ = nullptr;
};

}  // namespace ringcomm
