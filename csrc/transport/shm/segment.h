// A POSIX shared-memory segment: this rank's inbox.
//
// A segment holds FIFOs only for the ranks of this host that reach this rank
// over shared memory (its `members`, learnt from the host census at init), so
// its size grows with the local peers, never with the world size.
//
// Layout:
//   SegmentControl                      doorbell, sleep flag, abort / departure
//                                       flags and reason, liveness facts, the
//                                       owner's last call (see CallRecord)
//   FifoControl[members - 1]            head/tail counters of the FIFO from each peer
//   slots[members - 1][nslots]          each: one page for the MsgHeader (and how the
//                                       payload was written), then the
//                                       data area (slot_bytes + one page of slack so
//                                       the payload can start at any page offset)
// Peer p writes into its slots and bumps its fifo's tail; this rank reads and
// bumps head. Counters only grow, so "full" is tail - head == nslots.
//
// Names are "/ringcomm-<pid namespace>-<pid>-<128 random bits>": unguessable,
// and a segment whose owner died before unlinking it (SIGKILL during init)
// can be recognised and removed by the next rank that creates one
// (sweep_orphans).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/transport.h"  // CallState

namespace ringcomm {

constexpr uint64_t kSegmentMagic = 0x72696e67636f6d33ULL;  // "ringcom3"
constexpr size_t kPage = 4096;

// What the owner of a segment is doing, for the timeout messages of its peers
// (written by the owner only; readers retry while `version` is odd).
struct CallRecord {
  std::atomic<uint32_t> version;
  uint8_t kind;    // OpKind
  uint8_t state;   // CallState
  uint8_t p2p;     // 1: seq counts the point-to-point messages to/from `peer`
  uint8_t pad;
  int32_t peer;
  uint64_t seq;
};

struct alignas(64) SegmentControl {
  uint64_t magic;
  uint32_t world;
  uint32_t rank;
  uint32_t nslots;
  uint32_t members;
  uint64_t slot_bytes;
  uint32_t pad_lock;         // 1: the owner holds a flock on the segment while it lives (Segment::owner_gone)
  uint32_t pad2;
  uint64_t slot_stride;
  int64_t owner_pid;         // the creating process, for cross-memory attach and liveness
  uint64_t owner_pidns;      // inode of its pid namespace (pids mean nothing across namespaces)
  uint64_t owner_starttime;  // its start time (/proc/pid/stat), so a reused pid is not mistaken for it
  uint64_t owner_base;       // where the segment sits in the owner's address space
  alignas(64) std::atomic<uint32_t> bell;      // bumped by peers that changed a FIFO
  alignas(64) std::atomic<uint32_t> sleeping;  // 1 while this rank waits on the bell
  alignas(64) std::atomic<uint32_t> aborted;   // 1: failed or aborted (abort_reason says why)
  std::atomic<uint32_t> departed;              // 1: closed its communicator in order
  char abort_reason[512];
  alignas(64) CallRecord last_call[2];  // [0] collectives, [1] point-to-point
};

struct alignas(64) FifoControl {
  alignas(64) std::atomic<uint64_t> tail;  // segments published by the sender
  alignas(64) std::atomic<uint64_t> head;  // segments released by the receiver
  // In the inbox of rank s, the fifo of p holds in `pulled` the sequence
  // number of the last point-to-point message of s that p finished reading
  // directly (pull sends are acknowledged here, not in the FIFO, whose order
  // p2p cannot fix).
  alignas(64) std::atomic<uint64_t> pulled;
  // The receiver's (this inbox owner's) moving average of the time its
  // copies out of this FIFO's slots take, in seconds per byte as the bits of
  // a double, for slots written with cached [0] and non-temporal [1] stores;
  // the sender reads them to choose how to write (ShmLink::stream_slot).
  alignas(64) std::atomic<uint64_t> read_cost[2];
  std::atomic<uint64_t> read_samples;  // bumped after each update of read_cost
};

// Facts about the calling process that peers use to tell whether it lives.
uint64_t own_pid_namespace();
// The start time of process `pid` in clock ticks since boot (0 if unknown).
uint64_t process_start_time(int64_t pid);

class Segment {
 public:
  // Creates this rank's inbox for `members` (sorted global ranks that reach
  // it over shared memory, itself included): mode 0600, pre-faulted. With no
  // peer among the members the segment is anonymous (nothing in /dev/shm).
  static Segment create(int world, int rank, const std::vector<int>& members, size_t slot_bytes, int nslots);
  // Maps a peer's segment by name and checks its geometry.
  static Segment open(const std::string& name, int world, int expected_rank, const std::vector<int>& members,
                      size_t slot_bytes, int nslots);
  // A fresh name of the form create() gives names (for other shared buffers
  // of this job, such as the cuda_ipc stand-in's, so sweep_orphans covers them).
  static std::string fresh_name();
  // Whether `name` has the form create() gives names (checked before a name
  // read from the store is used).
  static bool valid_name(const std::string& name);
  // Removes a segment name that is known to be orphaned (its owner failed
  // during init). Only names of valid form are touched. Idempotent.
  static void unlink_name(const std::string& name);
  // Removes /dev/shm entries of this user whose owner (by the pid in the
  // name, in this pid namespace) is gone. Returns how many were removed.
  static int sweep_orphans();

  Segment() = default;
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  const std::string& name() const { return name_; }
  bool mapped() const { return base_ != nullptr; }
  // Liveness that needs no pid (peers in another pid namespace): the owner
  // holds an exclusive flock on its segment for as long as it lives (the
  // kernel drops it when the process dies); a peer's own descriptor can take
  // a shared lock only then. True when the owner of this (opened) segment is
  // gone; false while it lives or when the lock cannot tell.
  bool owner_gone() const;
  // Removes the name from /dev/shm (mappings stay valid). Idempotent.
  void unlink();

  SegmentControl* control() const { return reinterpret_cast<SegmentControl*>(base_); }
  // The FIFO from global rank `from` (a member other than the owner).
  FifoControl* fifo(int from) const;
  // Start of slot `i` of the FIFO from `from`: a header page, then the data area.
  char* slot(int from, uint64_t i) const;

  static size_t slot_stride(size_t slot_bytes);

 private:
  void reset();
  void layout(int world, int owner, const std::vector<int>& members, size_t slot_bytes, int nslots);
  static size_t slots_offset(size_t nfifos);

  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  int nslots_ = 0;
  size_t stride_ = 0;
  size_t nfifos_ = 0;
  std::vector<int32_t> fifo_of_;  // by global rank: FIFO index, -1 when none
  bool owner_ = false;
  bool unlinked_ = true;
  int fd_ = -1;           // kept open: the owner's holds its flock, a peer's tests it
  bool lockable_ = false;  // the owner took its lock (a peer: the lock can tell)
};

}  // namespace ringcomm
