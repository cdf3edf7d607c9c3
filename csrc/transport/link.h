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

#include <cstddef>
#include <cstdint>
#include <string>

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

  // A free slot to write at most slot_bytes() bytes into, or nullptr when all
  // slots are in flight. `page_offset` (0..4095) asks for the payload to sit
  // at that offset within a page, so that copies from / to user buffers keep
  // source and destination equally aligned (memcpy slows ~3x otherwise).
  virtual char* send_slot(uint32_t page_offset) = 0;
  // Publishes the slot returned by the last send_slot with this header.
  virtual void send_commit(const MsgHeader& header) = 0;

  // The oldest received segment (payload in *payload), or nullptr if none.
  virtual const MsgHeader* recv_peek(const char** payload) = 0;
  // Returns the segment from the last recv_peek to the sender.
  virtual void recv_release() = 0;

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
