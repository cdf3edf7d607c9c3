#include "comm/autotune.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ringcomm {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool within_band(double measured, double expected) {
  if (!(expected > 0) || !(measured > 0)) return true;  // nothing to compare with
  const double r = measured / expected;
  return r <= AutoTuner::kBand && r >= 1.0 / AutoTuner::kBand;
}

}  // namespace

const char* AutoTuner::state_name(State s) {
  switch (s) {
    case State::kOff: return "off";
    case State::kModel: return "model";
    case State::kExplore: return "exploring";
    case State::kTuned: return "tuned";
  }
  return "?";
}

void AutoTuner::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  slots_.clear();
  last_key_ = ~0ull;
  last_ = nullptr;
}

AutoTuner::Slot* AutoTuner::find(uint64_t key) const {
  if (key == last_key_) return last_;
  auto it = slots_.find(key);
  if (it == slots_.end()) return nullptr;
  last_key_ = key;
  last_ = const_cast<Slot*>(&it->second);
  return last_;
}

Algo AutoTuner::override_for(OpKind kind, size_t bytes) const {
  if (!on_) return Algo::kAuto;
  const Slot* s = find(key_of(kind, bytes));
  if (!s || s->state == State::kOff || s->state == State::kModel) return Algo::kAuto;
  return s->pick;
}

bool AutoTuner::wants_time(OpKind kind, size_t bytes) {
  Slot* s = find(key_of(kind, bytes));
  if (!s) return slots_.size() < kMaxSignatures;  // record() makes its slot (only this thread adds)
  switch (s->state) {
    case State::kOff: return false;
    case State::kExplore: return true;
    default:
      if (s->calls + kWindow < s->interval) {
        ++s->calls;
        return false;
      }
      return true;
  }
}

double AutoTuner::median(const Slot& s) {
  const uint32_t n = std::min<uint32_t>(s.sampled, kWindow);
  float v[kWindow];
  std::copy(s.window, s.window + n, v);
  std::nth_element(v, v + n / 2, v + n);
  return v[n / 2];
}

uint32_t AutoTuner::interval_for(double seconds, uint32_t backoff) {
  const double calls = kCheckSeconds / std::max(seconds, 1e-7) * backoff;
  return static_cast<uint32_t>(std::clamp(calls, double(kFirstCheck), double(1u << 24)));
}

bool AutoTuner::record(OpKind kind, size_t bytes, double seconds, int64_t* word,
                       const std::function<std::vector<Candidate>()>& candidates) {
  const uint64_t key = key_of(kind, bytes);
  Slot* s = find(key);
  if (!s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (slots_.size() >= kMaxSignatures) return false;
    Slot fresh;
    fresh.cands = candidates();
    if (fresh.cands.size() >= 2 && std::isfinite(fresh.cands[0].seconds)) {
      fresh.state = State::kModel;
      fresh.pick = fresh.cands[0].algo;
      fresh.predicted = fresh.cands[0].seconds;
      fresh.model_pick = fresh.cands[0].algo;
    }
    auto it = slots_.emplace(key, std::move(fresh)).first;
    last_key_ = key;
    last_ = s = &it->second;
    if (s->state == State::kOff) return false;
    // This first call is not sampled: it planned afresh (and may have opened links).
    return false;
  }
  if (s->state == State::kOff) return false;
  s->window[s->sampled % kWindow] = static_cast<float>(seconds);
  ++s->sampled;
  ++s->calls;
  const uint32_t due = s->state == State::kExplore ? kSamples : s->interval;
  if (s->calls < due) return false;
  *word = -static_cast<int64_t>(std::llround(median(*s) * 1e9));
  return true;
}

void AutoTuner::start_exploring(Slot& s, double current_seconds) {
  // The current pick is measured already (the window just agreed): it is
  // the first candidate; the others follow in the model's order.
  std::vector<Candidate> order;
  for (const Candidate& c : s.cands) {
    if (c.algo == s.pick) order.push_back(c);
  }
  for (const Candidate& c : s.cands) {
    if (c.algo != s.pick) order.push_back(c);
  }
  s.cands = std::move(order);
  s.state = State::kExplore;
  s.best = s.pick;
  s.best_seconds = current_seconds;
  s.measured.assign(1, {s.pick, current_seconds});
  s.cand = 1;
  s.pick = s.cands[1].algo;
  ++s.explorations;
}

bool AutoTuner::agreed(OpKind kind, size_t bytes, int64_t min_word) {
  Slot* s = find(key_of(kind, bytes));
  if (!s || s->state == State::kOff) return false;
  const double secs = -static_cast<double>(min_word) * 1e-9;  // the slowest rank's median
  std::lock_guard<std::mutex> lk(mu_);
  s->calls = 0;
  s->sampled = 0;
  const Algo before = s->pick;
  switch (s->state) {
    case State::kModel:
      if (within_band(secs, s->predicted)) {
        s->interval = interval_for(secs, s->backoff);
      } else {
        start_exploring(*s, secs);
      }
      break;
    case State::kTuned:
      if (within_band(secs, s->reference)) {
        s->interval = interval_for(secs, s->backoff);
      } else {
        start_exploring(*s, secs);
      }
      break;
    case State::kExplore: {
      s->measured.push_back({s->pick, secs});
      if (secs < s->best_seconds) {
        s->best_seconds = secs;
        s->best = s->pick;
      }
      if (++s->cand < s->cands.size()) {
        s->pick = s->cands[s->cand].algo;
        break;
      }
      // Done: keep the fastest. The same pick as last time: check less often.
      const Algo kept_before = s->cands[0].algo;
      s->backoff = s->best == kept_before ? std::min(kMaxBackoff, s->backoff * 2) : 1;
      s->state = State::kTuned;
      s->pick = s->best;
      s->reference = s->best_seconds;
      s->interval = interval_for(s->best_seconds, s->backoff);
      break;
    }
    case State::kOff: break;
  }
  return s->pick != before;
}

bool AutoTuner::report_of(OpKind kind, size_t bytes, Report* out) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = slots_.find(key_of(kind, bytes));
  if (it == slots_.end() || it->second.state == State::kOff) return false;
  const Slot& s = it->second;
  out->kind = kind;
  out->bytes = bytes;
  out->state = s.state;
  out->pick = s.pick;
  out->model_pick = s.model_pick;
  out->predicted = s.predicted;
  out->reference = s.state == State::kTuned ? s.reference : kNaN;
  out->explorations = s.explorations;
  out->measured = s.measured;
  return true;
}

std::vector<AutoTuner::Report> AutoTuner::report() const {
  std::vector<uint64_t> keys;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& kv : slots_) {
      if (kv.second.state != State::kOff) keys.push_back(kv.first);
    }
  }
  std::sort(keys.begin(), keys.end());
  std::vector<Report> out;
  for (uint64_t k : keys) {
    Report r;
    if (report_of(static_cast<OpKind>(k >> 56), static_cast<size_t>(k & ((1ull << 56) - 1)), &r)) out.push_back(r);
  }
  return out;
}

}  // namespace ringcomm
