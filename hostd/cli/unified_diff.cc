#include "unified_diff.h"

#include <algorithm>
#include <vector>

namespace hvtrace::cli {
namespace {

constexpr size_t kContext = 3;
// Beyond this many lines a side the O(n*m) table is too large; the diff is
// then the whole old text against the whole new one.
constexpr size_t kMaxLines = 4000;

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  }
  return lines;
}

struct Op {
  char kind;  // ' ', '-', '+'
  size_t old_line, new_line;
};

std::vector<Op> Script(const std::vector<std::string_view>& a,
                       const std::vector<std::string_view>& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<Op> ops;
  if (n > kMaxLines || m > kMaxLines) {
    for (size_t i = 0; i < n; ++i) ops.push_back({'-', i, 0});
    for (size_t j = 0; j < m; ++j) ops.push_back({'+', n, j});
    return ops;
  }
  // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
  std::vector<std::vector<uint32_t>> lcs(n + 1, std::vector<uint32_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;) {
    for (size_t j = m; j-- > 0;) {
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      ops.push_back({' ', i++, j++});
    } else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) {
      ops.push_back({'-', i++, j});  // Removals first, as diff -u prints them.
    } else {
      ops.push_back({'+', i, j++});
    }
  }
  return ops;
}

}  // namespace

std::string UnifiedDiff(std::string_view old_text, std::string_view new_text,
                        std::string_view old_name, std::string_view new_name) {
  const std::vector<std::string_view> a = Lines(old_text), b = Lines(new_text);
  const std::vector<Op> ops = Script(a, b);
  std::string out;
  size_t k = 0;
  while (k < ops.size()) {
    while (k < ops.size() && ops[k].kind == ' ') ++k;
    if (k == ops.size()) break;
    // A hunk: from kContext lines before this change to kContext after the
    // last change that is less than 2*kContext unchanged lines further on.
    const size_t start = k >= kContext ? k - kContext : 0;
    size_t end = k;
    for (size_t same = 0; end < ops.size(); ++end) {
      same = ops[end].kind == ' ' ? same + 1 : 0;
      if (same > 2 * kContext) break;
    }
    size_t stop = end;
    while (stop > k && ops[stop - 1].kind == ' ') --stop;
    stop = std::min(ops.size(), stop + kContext);
    size_t old_count = 0, new_count = 0;
    for (size_t x = start; x < stop; ++x) {
      if (ops[x].kind != '+') ++old_count;
      if (ops[x].kind != '-') ++new_count;
    }
    if (out.empty()) {
      out = "--- " + std::string(old_name) + "\n+++ " + std::string(new_name) + "\n";
    }
    // diff -u numbers an empty side's hunk by the line before it.
    const size_t old_first = ops[start].old_line + (old_count ? 1 : 0);
    const size_t new_first = ops[start].new_line + (new_count ? 1 : 0);
    // diff -u leaves out a count of 1.
    auto range = [](size_t first, size_t count) {
      return std::to_string(first) + (count == 1 ? "" : "," + std::to_string(count));
    };
    out += "@@ -" + range(old_first, old_count) + " +" + range(new_first, new_count) + " @@\n";
    for (size_t x = start; x < stop; ++x) {
      const std::string_view line = ops[x].kind == '+' ? b[ops[x].new_line] : a[ops[x].old_line];
      out += ops[x].kind;
      out += line;
      out += '\n';
    }
    k = stop;
  }
  return out;
}

}  // namespace hvtrace::cli
