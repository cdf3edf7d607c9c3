// The channel interface between the schedules and the transports.
//
// A Link is this rank's end of a pair of FIFOs to one peer. Messages travel in
// segments of at most slot_bytes(); every segment carries a MsgHeader, so the
// receiver can check that both ranks are running the same operation.
//
// The interface is slot based (zero copy where the transport allows it): the
// sender asks for a free slot, writes the payload into it and commits; the
// receiver peeks at the oldest segment, consumes its payload in place and
// releases it. For shared memory the slot is in the peer's mapped segment, so
// one copy moves the data; a socket transport stages slots locally.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "ringcomm/copy.h"
#include "ringcomm/msg_tag.h"

namespace ringcomm {

struct MsgHeader {
  MsgTag tag;
  uint32_t nbytes = 0;          // payload bytes in this segment
  uint32_t payload_offset = 0;  // where the payload starts within the slot's data area
  uint64_t segment = 0;         // index of this segment within the transfer
};

// Where `p` sits within its 4 KiB page (what Link::send_slot aligns slots to).
inline uint32_t page_offset(const void* p) { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 4095); }

class Link {
 public:
  virtual ~Link() = default;
  virtual size_t slot_bytes() const = 0;

  // A free slot to write `nbytes` (at most slot_bytes()) into, or nullptr
  // when all slots are in flight. `page_offset` (0..4095) asks for the
  // payload to sit at that offset within a page, so that copies from / to
  // user buffers keep source and destination equally aligned (memcpy slows
  // ~3x otherwise); the size lets a link place a small payload where it
  // costs least (shm: payload_offset_for).
  virtual char* send_slot(uint32_t page_offset, size_t nbytes) = 0;
  // Publishes the slot returned by the last send_slot with this header.
  virtual void send_commit(const MsgHeader& header) = 0;

  // The oldest received segment (payload in *payload), or nullptr if none.
  virtual const MsgHeader* recv_peek(const char** payload) = 0;
  // Returns the segment from the last recv_peek to the sender.
  virtual void recv_release() = 0;

  // How a slot's payload is written and read, for links whose peer reads
  // the slot straight from the writer's stores (shared memory). On some
  // placements of a VM's cores, moving lines between the two cores' caches
  // (the writer's stores to lines the reader last held, the reader's loads of
  // lines the writer's cache still holds modified) runs 3-5x slower than
  // through memory; writing the slot with non-temporal stores (around the
  // caches) avoids it, at the cost of the cache's speed where the cores
  // share one. Both ends time their copies and the writer picks the faster
  // way (ShmLink says how). Other links: plain copies, untimed.
  //
  // fill_slot writes n bytes at src into the slot the last send_slot returned;
  // copy_out copies n bytes of the peeked segment's payload to dst
  // (`streaming`: the destination written around the caches).
  void fill_slot(char* slot, const char* src, size_t n);
  void copy_out(char* dst, const char* payload, size_t n, bool streaming);
  // Runs `read`, which reads the n bytes of the peeked segment's payload
  // otherwise (a reduction), timed as copy_out times its copies.
  template <class Read>
  void read_payload(size_t n, Read&& read) {
    const bool timed = time_copy_out(n);
    const double seconds = run_timed(timed, read);
    if (timed) copied_out(n, seconds);
  }
  // Runs f; returns the seconds it took when `timed`, else 0.
  template <class F>
  static double run_timed(bool timed, F&& f) {
    if (!timed) {
      f();
      return 0;
    }
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // Whether n bytes of the slot from the last send_slot are to be written
  // with non-temporal stores (asked once per slot, by fill_slot).
  virtual bool stream_slot(size_t /*n*/) { return false; }
  // Whether fill_slot / copy_out (read_payload) should time their copy of n
  // bytes (of the slot being filled / the peeked segment), and what they measured.
  virtual bool time_fill(size_t /*n*/) { return false; }
  virtual void filled(size_t /*n*/, double /*seconds*/) {}
  virtual bool time_copy_out(size_t /*n*/) { return false; }
  virtual void copied_out(size_t /*n*/, double /*seconds*/) {}

  // Zero-copy sends (transports that stage slots locally, TCP): a segment of
  // at least ref_min_bytes() may leave straight from the caller's memory.
  // Instead of send_commit, send_ref publishes the slot the last send_slot
  // returned as a frame whose payload is `src` (header.nbytes bytes), and
  // returns a ticket; the bytes must stay unchanged until sent(ticket), when
  // the transport no longer reads them. A caller that stops before that (an
  // error) calls Transport::release_refs(), which copies what is still
  // referenced into the transport's own slots. SIZE_MAX: the link has no
  // such sends.
  virtual size_t ref_min_bytes() const { return SIZE_MAX; }
  virtual uint64_t send_ref(const char* src, const MsgHeader& header);
  virtual bool sent(uint64_t /*ticket*/) { return true; }
  // After send_slot returned `slot`: queues header.nbytes bytes at `src` as
  // that segment, by reference when there are at least `ref_min` (the
  // ticket), else copied into the slot (0).
  uint64_t send_from(char* slot, const char* src, const MsgHeader& header, size_t ref_min) {
    if (header.nbytes >= ref_min) return send_ref(src, header);
    fill_slot(slot, src, header.nbytes);
    send_commit(header);
    return 0;
  }

  // Receives straight into the caller's memory (transports that stage slots
  // locally, TCP), for transfers whose segments need no reduction: post_recv
  // asks for the next segments from this peer, `nbytes` bytes in segments
  // of seg_bytes (the last one shorter) numbered from `segment`, all with
  // `tag`, to land at `dst` instead of in slots. False: not now (a segment
  // is waiting in a slot or being read into one: take it with recv_peek).
  // Then posted() says how many bytes have landed (whole segments, in order)
  // and, in *over, whether the post has ended: everything landed, or a frame
  // that is not the next segment came (it, and what follows, go through
  // recv_peek), or the link stopped being open. Until it has ended, recv_peek
  // sees nothing; a caller that stops before (an error) calls
  // Transport::release_refs(), after which nothing is written to `dst`.
  // SIZE_MAX: the link has no such receives.
  virtual size_t post_min_bytes() const { return SIZE_MAX; }
  virtual bool post_recv(char* /*dst*/, size_t /*nbytes*/, const MsgTag& /*tag*/, uint64_t /*segment*/,
                         size_t /*seg_bytes*/) {
    return false;
  }
  virtual size_t posted(bool* over) {
    *over = true;
    return 0;
  }
  // posted(), counted into a transfer's progress: what landed since *landed
  // (segments of seg_bytes but the last) is added to *done and *segment.
  // Returns whether anything landed; *over as posted() says.
  bool take_landed(size_t seg_bytes, size_t* landed, size_t* done, uint64_t* segment, bool* over) {
    const size_t now = posted(over);
    if (now == *landed) return false;
    const size_t delta = now - *landed;
    *done += delta;
    *segment += (delta + seg_bytes - 1) / seg_bytes;
    *landed = now;
    return true;
  }

  // Single copy: reads `nbytes` at `remote_addr` in the peer's address space
  // into `dst`. Only links whose transport reported the capability (see
  // Transport::can_read_remote) are asked; others throw.
  virtual void read_remote(void* dst, uint64_t remote_addr, size_t nbytes);
  // Point-to-point pulls: the receiver tells the sender it finished reading
  // message `seq`; the sender reads the highest such seq.
  virtual void ack_pull(uint64_t seq);
  virtual uint64_t pulled();
};

}  // namespace ringcomm
