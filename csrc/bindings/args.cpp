// Arguments the bindings parse from names (bindings/bind.h).
#include <string>

#include "bindings/bind.h"
#include "ringcomm/types.h"

namespace ringcomm {

OpKind collective_arg(const std::string& name, bool barrier_ok) {
  OpKind k;
  if (collective_from_name(name, &k) && (barrier_ok || k != OpKind::kBarrier)) return k;
  throw ValueError("unknown collective '" + name +
                   "' (all_reduce, reduce_scatter, all_gather, broadcast, reduce, scatter, gather, all_to_all" +
                   (barrier_ok ? ", barrier)" : ")"));
}

Algo algo_arg(const std::string& op, OpKind kind, const std::string& algo) {
  // "op:name" makes the parser refuse a name the op has no schedule of.
  return algo == "auto" ? Algo::kAuto : parse_algo_choice(op + ":" + algo).of(kind);
}

}  // namespace ringcomm
