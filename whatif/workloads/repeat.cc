#include "whatif/workloads/repeat.h"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace loom::whatif {

namespace {

// Where iteration `number` lies: its begin marker (start) and the next
// iteration's (cut; the trace's end when there is none). False when it has
// no begin marker or is not complete (neither the next begin nor its own
// end marker follows).
bool FindIteration(const plan::Trace& trace, uint64_t number, size_t* start,
                   size_t* cut) {
  const size_t n = trace.events.size();
  *start = n;
  *cut = n;
  bool ended = false;
  for (size_t t = 0; t < n; ++t) {
    const plan::Event& e = trace.events[t];
    if (e.kind == plan::EventKind::kIterationBegin) {
      if (e.id == number && *start == n) *start = t;
      if (e.id == number + 1 && *start != n) {
        *cut = t;
        return true;
      }
    } else if (e.kind == plan::EventKind::kIterationEnd && e.id == number &&
               *start != n) {
      ended = true;
    }
  }
  return *start != n && ended;
}

}  // namespace

int64_t CompleteIterations(const plan::Trace& trace, int64_t from) {
  size_t start, cut;
  int64_t complete = from;
  while (FindIteration(trace, static_cast<uint64_t>(complete), &start, &cut))
    ++complete;
  return complete;
}

StatusOr<RepeatedTrace> RepeatSteadyIteration(const plan::Trace& trace,
                                              const RepeatOptions& options) {
  if (options.keep < 1 || options.copies < 0) {
    return InvalidArgumentError(
        "repeating a trace: keep {} iterations (>= 1), {} copies (>= 0)",
        options.keep, options.copies);
  }
  const uint64_t copied = static_cast<uint64_t>(options.keep - 1);
  size_t start, cut;
  if (!FindIteration(trace, copied, &start, &cut)) {
    if (start == trace.events.size()) {
      return InvalidArgumentError(
          "repeating a trace: no begin marker of iteration {} (keep {} "
          "iterations: iteration {} is copied)",
          copied, options.keep, copied);
    }
    return InvalidArgumentError(
        "repeating a trace: iteration {} is not complete in it", copied);
  }

  RepeatedTrace out;
  out.trace.header = trace.header;
  out.trace.names = trace.names;
  out.kept_events = cut;
  out.template_events = cut - start;
  out.trace.events.assign(trace.events.begin(), trace.events.begin() + cut);

  // Where and how large each request of the kept part is.
  struct Request {
    size_t alloc = 0;
    uint64_t size = 0;
    bool freed = false;
  };
  std::unordered_map<uint64_t, Request> requests;
  uint64_t next_id = 1;
  for (size_t t = 0; t < cut; ++t) {
    const plan::Event& e = trace.events[t];
    if (e.kind == plan::EventKind::kAlloc) {
      requests[e.id] = Request{t, e.size, false};
      next_id = std::max(next_id, e.id + 1);
    } else if (e.kind == plan::EventKind::kFree) {
      auto it = requests.find(e.id);
      if (it != requests.end()) it->second.freed = true;
    }
  }
  // Outgoing: made in the template and not freed by the cut, per size in
  // allocation order. Incoming: freed in the template, made before it.
  std::map<uint64_t, std::deque<uint64_t>> outgoing;  // size -> ids
  std::vector<uint64_t> incoming;                     // ids
  for (size_t t = start; t < cut; ++t) {
    const plan::Event& e = trace.events[t];
    if (e.kind == plan::EventKind::kAlloc && !requests[e.id].freed) {
      outgoing[e.size].push_back(e.id);
    } else if (e.kind == plan::EventKind::kFree) {
      auto it = requests.find(e.id);
      if (it != requests.end() && it->second.alloc < start) {
        incoming.push_back(e.id);
      }
    }
  }
  std::sort(incoming.begin(), incoming.end(), [&](uint64_t a, uint64_t b) {
    return requests[a].alloc < requests[b].alloc;
  });
  // incoming id -> the outgoing template request its free frees.
  std::unordered_map<uint64_t, uint64_t> carried;
  std::unordered_set<uint64_t> made_once;  // template ids not copied
  for (uint64_t id : incoming) {
    auto it = outgoing.find(requests[id].size);
    if (it == outgoing.end() || it->second.empty()) {
      ++out.dropped_frees;
      continue;
    }
    carried[id] = it->second.front();
    it->second.pop_front();
    ++out.carried_frees;
  }
  if (options.carry_any_size) {
    // What is left, in allocation order whatever the sizes: a perturbed
    // trace's resized and added requests.
    std::vector<uint64_t> left_out;
    for (const auto& [size, ids] : outgoing)
      left_out.insert(left_out.end(), ids.begin(), ids.end());
    std::sort(left_out.begin(), left_out.end(), [&](uint64_t a, uint64_t b) {
      return requests[a].alloc < requests[b].alloc;
    });
    std::vector<uint64_t> left_in;
    for (uint64_t id : incoming)
      if (!carried.contains(id)) left_in.push_back(id);
    const size_t pairs = std::min(left_in.size(), left_out.size());
    for (size_t i = 0; i < pairs; ++i) carried[left_in[i]] = left_out[i];
    out.carried_frees += pairs;
    out.dropped_frees -= pairs;
    // Requests still without a counterpart would stay live, one more per
    // copy: they are made once, in the template, as persistent state is.
    for (size_t i = pairs; i < left_out.size(); ++i)
      made_once.insert(left_out[i]);
  } else {
    for (const auto& [size, ids] : outgoing) out.lasting_allocs += ids.size();
  }

  // The copies. previous[template id] = the id it had in the copy before
  // (the template's own ids for the first copy).
  std::unordered_map<uint64_t, uint64_t> previous, current;
  for (size_t t = start; t < cut; ++t) {
    const plan::Event& e = trace.events[t];
    if (e.kind == plan::EventKind::kAlloc) previous[e.id] = e.id;
  }
  out.trace.events.reserve(cut + static_cast<size_t>(options.copies) *
                                     out.template_events);
  for (int64_t c = 0; c < options.copies; ++c) {
    current.clear();
    const uint64_t number = static_cast<uint64_t>(options.keep + c);
    for (size_t t = start; t < cut; ++t) {
      plan::Event e = trace.events[t];
      switch (e.kind) {
        case plan::EventKind::kAlloc:
          if (made_once.contains(e.id)) continue;
          current[e.id] = next_id;
          e.id = next_id++;
          break;
        case plan::EventKind::kFree: {
          if (auto own = current.find(e.id); own != current.end()) {
            e.id = own->second;
            break;
          }
          auto carry = carried.find(e.id);
          if (carry == carried.end()) continue;  // dropped
          e.id = previous.at(carry->second);
          break;
        }
        case plan::EventKind::kIterationBegin:
        case plan::EventKind::kIterationEnd:
          e.id = number;
          break;
        default:
          break;
      }
      out.trace.events.push_back(e);
    }
    previous.swap(current);
  }
  return out;
}

StatusOr<plan::Trace> ThenRepeatLastIteration(const plan::Trace& trace,
                                              int64_t copies) {
  if (copies < 0) {
    return InvalidArgumentError(
        "{} copies of the last iteration (give a count >= 0)", copies);
  }
  StatusOr<RepeatedTrace> repeated = RepeatSteadyIteration(
      trace, RepeatOptions{.keep = CompleteIterations(trace, 1),
                           .copies = copies,
                           .carry_any_size = true});
  if (!repeated.ok()) {
    return repeated.status().WithContext(
        "copying the input's last complete iteration");
  }
  return std::move(repeated->trace);
}

}  // namespace loom::whatif
