// A POSIX shared-memory segment: this rank's inbox.
//
// Layout (every rank creates one, sized for the whole communicator):
//   SegmentControl                      doorbell, sleep flag, abort flag/reason
//   FifoControl[world]                  head/tail counters of the FIFO from each peer
//   slots[world][nslots]                each: one page for the MsgHeader, then the
//                                       data area (slot_bytes + one page of slack so
//                                       the payload can start at any page offset)
// Peer p writes into slots[p][*] and bumps fifo[p].tail; this rank reads and
// bumps fifo[p].head. Counters only grow, so "full" is tail - head == nslots.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringcomm {

constexpr uint64_t kSegmentMagic = 0x72696e67636f6d31ULL;  // "ringcom1"
constexpr size_t kPage = 4096;

struct alignas(64) SegmentControl {
  uint64_t magic;
  uint32_t world;
  uint32_t rank;
  uint32_t nslots;
  uint32_t pad;
  uint64_t slot_bytes;
  uint64_t slot_stride;
  int64_t owner_pid;    // the creating process, for cross-memory attach
  uint64_t owner_base;  // where the segment sits in the owner's address space
  alignas(64) std::atomic<uint32_t> bell;      // bumped by peers that changed a FIFO
  alignas(64) std::atomic<uint32_t> sleeping;  // 1 while this rank waits on the bell
  alignas(64) std::atomic<uint32_t> aborted;
  char abort_reason[512];
};

struct alignas(64) FifoControl {
  alignas(64) std::atomic<uint64_t> tail;  // segments published by the sender
  alignas(64) std::atomic<uint64_t> head;  // segments released by the receiver
  // In the inbox of rank s, fifo[p].pulled: the sequence number of the last
  // point-to-point message of s that p finished reading directly (pull sends
  // are acknowledged here, not in the FIFO, whose order p2p cannot fix).
  alignas(64) std::atomic<uint64_t> pulled;
};

class Segment {
 public:
  // Creates a fresh segment with an unguessable name, mode 0600, pre-faulted.
  static Segment create(int world, int rank, size_t slot_bytes, int nslots);
  // Maps a peer's segment by name and checks its geometry.
  static Segment open(const std::string& name, int world, int expected_rank, size_t slot_bytes,
                      int nslots);

  Segment() = default;
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  const std::string& name() const { return name_; }
  bool mapped() const { return base_ != nullptr; }
  // Removes the name from /dev/shm (mappings stay valid). Idempotent.
  void unlink();

  SegmentControl* control() const { return reinterpret_cast<SegmentControl*>(base_); }
  FifoControl* fifo(int from) const;
  // Start of slot `i` of the FIFO from `from`: a header page, then the data area.
  char* slot(int from, uint64_t i) const;

  static size_t slot_stride(size_t slot_bytes);

 private:
  void reset();
  static size_t total_bytes(int world, size_t slot_bytes, int nslots);
  static size_t slots_offset(int world);

  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  int world_ = 0;
  int nslots_ = 0;
  size_t stride_ = 0;
  bool owner_ = false;
  bool unlinked_ = true;
};

}  // namespace ringcomm
