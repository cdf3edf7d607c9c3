// Point-to-point calls: send/recv groups that progress together through the
// matcher (comm/p2p_match.cpp), and sendrecv.
#include "comm/communicator.h"

namespace ringcomm {

void Communicator::sendrecv(Buffer send_buf, int dst, Buffer recv_buf, int src) {
  Inside inside(inside_);
  P2pMember m[2];
  m[0].call = p2p_call(send_buf, dst, 0, true);
  m[1].call = p2p_call(recv_buf, src, 0, false);
  std::unique_lock<std::mutex> lk(mu_);
  check_usable();
  assign_seq(m[0].call);
  assign_seq(m[1].call);
  if (queue_.empty() && !running_) {
    // Both run in this thread as one group (the latency path).
    running_ = true;
    running_name_ = "sendrecv";  // (a literal: no string built per call)
    running_seq_ = 0;
    lk.unlock();
    Work ws(m[0].call.op), wr(m[1].call.op);  // never waited on
    m[0].work = &ws;
    m[1].work = &wr;
    execute_p2p(m, 2, false);
    release_inline();
    ws.rethrow();
    wr.rethrow();
    return;
  }
  // Behind queued calls: both join the worker's send/recv group.
  auto ws = enqueue(std::move(m[0].call), lk, true);
  lk.lock();
  auto wr = enqueue(std::move(m[1].call), lk, true);
  ws->wait(-1);
  wr->wait(-1);
}

// Consecutive send/recv calls run as one group whose operations progress
// together, as isend/irecv do in torch.distributed: a large isend never
// blocks the irecv issued after it (which would deadlock two ranks that
// exchange). Calls queued while the group runs join it (`take_queued`: the
// worker's groups); the group ends when every member is done and the next
// queued call (if any) is a collective, so issue order between collectives
// and point-to-point calls is kept. Matching (tags, any source) and the
// messages held between groups are the matcher's (comm/p2p_match.cpp).
void Communicator::post_p2p(P2pMember& m) {
  Call& c = m.call;
  m.deadline = deadline_from_now();
  record(c, CallState::kRunning);
  const uint8_t dtype = static_cast<uint8_t>(c.a.dtype);
  m.op = c.is_send ? matcher_.post_send(c.a.ptr, c.a.nbytes(), dtype, c.a.count, c.root, c.p2p_tag, c.tag.seq)
                   : matcher_.post_recv(c.a.ptr, c.a.nbytes(), dtype, c.a.count, c.root, c.p2p_tag, c.tag.seq);
}

void Communicator::execute_p2p(P2pMember* first, size_t n, bool take_queued) {
  std::vector<P2pMember>& group = p2p_group_;
  group.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) {
      for (size_t i = 0; i < n; ++i) {
        first[i].work->fail(Work::ErrorKind::kError, "ringcomm: " + std::string(first[i].call.name()) +
                                                         " was not run: the communicator failed earlier (" + error_ + ")");
      }
      return;
    }
  }
  // The deadline and the timeout's words are those of the oldest unfinished member.
  size_t ndone = 0, oldest = 0, described = SIZE_MAX;
  Clock::time_point deadline;
  CallInfo info;
  auto point_at_oldest = [&] {
    while (oldest < group.size() && group[oldest].done) ++oldest;
    if (oldest < group.size() && described != oldest) {
      described = oldest;
      deadline = group[oldest].deadline;
      info = info_of(group[oldest].call);
    }
  };
  // Completes finished members, takes newly queued send/recv calls.
  auto step = [&] {
    bool moved = matcher_.progress();
    for (P2pMember& m : group) {
      if (m.done || !m.op->complete) continue;
      m.done = true;
      ++ndone;
      record(m.call, CallState::kFinished);
      if (!m.call.is_send) m.work->set_source(m.op->source);
      matcher_.finish(m.op);
      m.op = nullptr;
      m.work->complete();
      moved = true;
    }
    if (take_queued) {
      std::lock_guard<std::mutex> lk(mu_);
      while (!queue_.empty() && queue_.front().first.kind == OpKind::kSend) {
        group.emplace_back();
        described = SIZE_MAX;  // the group may have moved: `info` names the oldest's call again
        P2pMember& m = group.back();
        m.call = std::move(queue_.front().first);
        m.keep = std::move(queue_.front().second);
        m.work = m.keep.get();
        queue_.pop_front();
        post_p2p(m);
        moved = true;
      }
    }
    if (moved) point_at_oldest();
    return moved;
  };
  try {
    for (size_t i = 0; i < n; ++i) {
      group.push_back(std::move(first[i]));
      post_p2p(group.back());
    }
    point_at_oldest();
    executor_.drive(step, [&] { return ndone == group.size(); }, deadline, info, [&] {
      const P2pMember& m = group[oldest];
      executor_.throw_timeout(info, matcher_.waiting_text(*m.op));
    });
    group.clear();
    return;
  } catch (const std::exception& e) {
    // A peer that aborted meanwhile (its send timed out behind a message
    // this rank could not take) is the error; the held limit is the why.
    std::string why = e.what();
    const std::string limit = matcher_.limit_text();
    if (!limit.empty() && why.find("RINGCOMM_P2P_UNEXPECTED_MB") == std::string::npos) why += " (" + limit + ")";
    fail(why);
    const Work::ErrorKind kind = error_kind_of(e);
    for (P2pMember& m : group) {
      if (!m.done) {
        record(m.call, CallState::kFailed);
        m.work->fail(kind, why);
      }
    }
    router_.release_refs();  // a send that failed before drive() did (while posting)
    matcher_.reset();
    for (P2pMember& m : group) matcher_.finish(m.op);
    // Members not posted yet (the error came while posting).
    for (size_t i = group.size(); i < n; ++i) first[i].work->fail(kind, why);
  }
  group.clear();
}

}  // namespace ringcomm
