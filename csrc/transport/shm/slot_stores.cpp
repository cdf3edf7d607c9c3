#include "transport/shm/slot_stores.h"

#include "ringcomm/types.h"

namespace ringcomm {

SlotStoreMode parse_slot_stores(const std::string& name) {
  if (name == "auto") return SlotStoreMode::kAuto;
  if (name == "cached") return SlotStoreMode::kCached;
  if (name == "streamed") return SlotStoreMode::kStreamed;
  throw ValueError("ringcomm: slot stores '" + name + "' is not one of auto, cached, streamed");
}

}  // namespace ringcomm
