// The experiment's schemes grouped by family. A reader compares like with like (the top-k selectors with each
// other, the 16-bit formats with each other) and then the best of each family against the others, so the plots
// draw one panel per family plus a panel of each family's best, and the table and RESULTS.md follow the same
// grouping.
#pragma once

#include "trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace fmnist {

struct family {
  const char* name;  // short: the legend of the bytes plot and the family column of summary.csv
  const char* title; // the panel's title
  std::vector<std::string> prefixes; // first ':'-separated part of the scheme names it holds
  std::vector<std::string> defaults; // what `experiment` runs when --schemes is not given
};

// Panel order. The defaults keep the demo at a few minutes on two cores: top-k at one density (0.01, where
// every selector reaches the target), CSSGD at r = 1 and 2 with the xor combiner (r = 3 alone costs 150 s of
// CPU, 45 % of a demo that includes it, and int32 three times xor's; --schemes runs either), one setting of
// each compressor (random-k at 0.01 falls short of the target in 2 epochs).
inline const std::vector<family>& families() {
  static const std::vector<family> all{
      {"dense", "dense baselines", {"ring", "allgather"}, {"ring", "allgather"}},
      {"top-k",
       "top-k selectors (density 0.01, sparse all-gather)",
       {"topk"},
       {"topk:exact:0.01", "topk:radix:0.01", "topk:laplace_bisect:0.01", "topk:hierarchical:0.01",
        "topk:sampled:0.01"}},
      {"sparse all-reduce",
       "top-k by the sparse all-reduce (Ok-Topk)",
       {"topk_ar"},
       {"topk_ar:laplace_bisect:0.01", "topk_ar:laplace_bisect:0.001"}},
      {"compressors",
       "compressors (QSGD, sign, random-k)",
       {"qsgd", "sign", "random_k"},
       {"qsgd:4", "sign", "random_k:0.1"}},
      {"PowerSGD", "PowerSGD (rank r, error feedback)", {"powersgd"}, {"powersgd:1", "powersgd:4"}},
      {"16-bit", "16-bit values (fp16, bf16)", {"fp16", "bf16"}, {"fp16", "bf16"}},
      {"CSSGD", "coding: CSSGD (redundancy r)", {"cssgd"}, {"cssgd:1:xor", "cssgd:2:xor"}},
      {"sync",
       "sync strategies (async PS, local SGD, partitioned)",
       {"asgd", "local", "local_adaptive", "partitioned"},
       {"asgd", "local:4", "local_adaptive:8:0.02", "partitioned"}},
  };
  return all;
}

// Index into families() of a scheme name; families().size() when no family claims it.
inline std::size_t family_index(const std::string& scheme) {
  const std::string head = scheme.substr(0, scheme.find(':'));
  const auto& all = families();
  for (std::size_t f = 0; f < all.size(); ++f)
    if (std::find(all[f].prefixes.begin(), all[f].prefixes.end(), head) != all[f].prefixes.end()) return f;
  return all.size();
}

inline std::string family_name(const std::string& scheme) {
  const auto f = family_index(scheme);
  return f < families().size() ? families()[f].name : "other";
}

inline std::vector<std::string> default_schemes() {
  std::vector<std::string> s;
  for (const auto& f : families())
    s.insert(s.end(), f.defaults.begin(), f.defaults.end());
  return s;
}

// Runs in family order, so the table, summary.csv and the bars of the bytes plot come out grouped.
inline void sort_by_family(std::vector<train_result>& results) {
  std::stable_sort(results.begin(), results.end(), [](const train_result& a, const train_result& b) {
    return family_index(a.scheme) < family_index(b.scheme);
  });
}

// The run of one family a user would pick: the soonest to the target, or, when none reaches it, the most
// accurate at the end.
inline const train_result* best_of(const std::vector<const train_result*>& runs) {
  const train_result* best = nullptr;
  auto better = [](const train_result& a, const train_result& b) {
    const bool ra = a.time_to_target >= 0, rb = b.time_to_target >= 0;
    if (ra != rb) return ra;
    if (ra) return a.time_to_target < b.time_to_target;
    return a.curve.back().accuracy > b.curve.back().accuracy;
  };
  for (const auto* r : runs)
    if (!r->curve.empty() && (!best || better(*r, *best))) best = r;
  return best;
}

struct panel {
  std::string title;
  std::vector<std::string> schemes;
  std::string reference; // drawn grey and dashed under the panel's own lines ("" = none)
};

// The family panels that have runs, then the best-of-families panel. Ring SSGD is every family panel's
// reference line, so each panel reads on its own.
inline std::vector<panel> make_panels(const std::vector<train_result>& results) {
  std::vector<panel> out;
  std::vector<std::string> best;
  const bool have_ring =
      std::any_of(results.begin(), results.end(), [](const train_result& r) { return r.scheme == "ring"; });
  for (std::size_t f = 0; f <= families().size(); ++f) {
    std::vector<const train_result*> runs;
    for (const auto& r : results)
      if (family_index(r.scheme) == f && !r.curve.empty()) runs.push_back(&r);
    if (runs.empty()) continue;
    panel p{f < families().size() ? families()[f].title : "other schemes", {}, {}};
    for (const auto* r : runs)
      p.schemes.push_back(r->scheme);
    if (have_ring && std::find(p.schemes.begin(), p.schemes.end(), "ring") == p.schemes.end())
      p.reference = "ring";
    out.push_back(std::move(p));
    best.push_back(best_of(runs)->scheme);
  }
  out.push_back({"best of each family (soonest to the target)", best, {}});
  return out;
}

// One panel a line, "title|scheme scheme ...|reference", for plots.gp (scheme names hold no spaces or bars).
inline void write_panels(const std::string& path, const std::vector<panel>& panels) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  for (const auto& p : panels) {
    std::fprintf(f, "%s|", p.title.c_str());
    for (std::size_t i = 0; i < p.schemes.size(); ++i)
      std::fprintf(f, "%s%s", i ? " " : "", p.schemes[i].c_str());
    std::fprintf(f, "|%s\n", p.reference.c_str());
  }
  std::fclose(f);
}

} // namespace fmnist
