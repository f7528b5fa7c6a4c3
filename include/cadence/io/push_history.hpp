// Reading and writing push histories in the ElasticBSP authors' published generator format:
// one worker per line, `id:t1,t2,...,tk,` with integer millisecond timestamps.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <istream>
#include <numeric>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence {

/// Push timestamps of n workers, ordered by ascending worker id; rows may differ in length
/// (each has at least one timestamp). Stored ragged: values plus n + 1 offsets, so rows()
/// is a zero-copy rows_view for ZipLine (of predicted times) or for predictors (per row).
template <class T = std::int64_t>
class push_history {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>,
                "cadence::push_history<T>: the format stores integer milliseconds; T must be an "
                "integer type");

public:
  using value_type = T;

  push_history() = default;

  /// Takes ragged storage directly: ids strictly ascending, offsets.size() == ids.size() + 1,
  /// offsets[0] == 0, offsets.back() == values.size(), every row non-empty. Throws
  /// invalid_parameter_error otherwise.
  push_history(std::vector<std::int64_t> ids, std::vector<T> values,
               std::vector<std::size_t> offsets)
      : ids_(std::move(ids)), values_(std::move(values)), offsets_(std::move(offsets)) {
    if (offsets_.size() != ids_.size() + 1 || offsets_.front() != 0 ||
        offsets_.back() != values_.size())
      throw invalid_parameter_error("cadence::push_history: offsets do not match ids and values");
    for (std::size_t p = 0; p < ids_.size(); ++p) {
      if (offsets_[p + 1] <= offsets_[p])
        throw invalid_parameter_error("cadence::push_history: worker " +
                                      std::to_string(ids_[p]) + " has no timestamps");
      if (p > 0 && ids_[p] <= ids_[p - 1])
        throw invalid_parameter_error("cadence::push_history: ids must be strictly ascending (" +
                                      std::to_string(ids_[p - 1]) + " then " +
                                      std::to_string(ids_[p]) + ")");
    }
  }

  /// Adds worker `id` with timestamps `row`, keeping ascending id order. Throws
  /// invalid_parameter_error for a duplicate id or an empty row.
  void add(std::int64_t id, span<const T> row) {
    if (row.empty())
      throw invalid_parameter_error("cadence::push_history: worker " + std::to_string(id) +
                                    " has no timestamps");
    const auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
    if (it != ids_.end() && *it == id)
      throw invalid_parameter_error("cadence::push_history: duplicate worker id " +
                                    std::to_string(id));
    const auto p = static_cast<std::size_t>(it - ids_.begin());
    ids_.insert(it, id);
    values_.insert(values_.begin() + static_cast<std::ptrdiff_t>(offsets_[p]), row.begin(),
                   row.end());
    offsets_.insert(offsets_.begin() + static_cast<std::ptrdiff_t>(p + 1), offsets_[p]);
    for (std::size_t q = p + 1; q < offsets_.size(); ++q) offsets_[q] += row.size();
  }

  /// Number of workers.
  std::size_t size() const noexcept { return ids_.size(); }
  bool empty() const noexcept { return ids_.empty(); }
  /// Worker ids, ascending; ids()[p] is the id of row p.
  const std::vector<std::int64_t>& ids() const noexcept { return ids_; }
  /// Timestamps of row p (the worker with the p-th smallest id).
  span<const T> row(std::size_t p) const noexcept {
    return span<const T>(values_.data() + offsets_[p], offsets_[p + 1] - offsets_[p]);
  }
  const std::vector<T>& values() const noexcept { return values_; }
  const std::vector<std::size_t>& offsets() const noexcept { return offsets_; }
  /// All rows as a ragged rows_view (valid while this object lives and is not modified).
  rows_view<T> rows() const noexcept {
    return rows_view<T>::ragged(values_.data(), offsets_.data(), ids_.size());
  }

  friend bool operator==(const push_history& a, const push_history& b) {
    return a.ids_ == b.ids_ && a.values_ == b.values_ && a.offsets_ == b.offsets_;
  }
  friend bool operator!=(const push_history& a, const push_history& b) { return !(a == b); }

private:
  std::vector<std::int64_t> ids_;
  std::vector<T> values_;
  std::vector<std::size_t> offsets_{0};
};

namespace detail {

inline std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

template <class I>
bool parse_integer(std::string_view s, I& out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  const auto res = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && res.ec == std::errc() && res.ptr == s.data() + s.size();
}

}  // namespace detail

/// Reads a push history. Format, one worker per line: `id:t1,t2,...,tk,` where id and the
/// timestamps are decimal integers (blanks around fields are ignored; the trailing comma is
/// optional; blank lines are skipped; CRLF line ends are accepted). Every worker needs at
/// least one timestamp and its timestamps must not decrease. Throws parse_error
/// "SOURCE:LINE: what was wrong" for a malformed line, a value that does not fit T, or a
/// duplicate id (naming both lines). `source` names the input in messages.
template <class T = std::int64_t>
push_history<T> read_push_history(std::istream& in, std::string_view source = "<stream>") {
  struct entry {
    std::int64_t id;
    std::size_t line, begin, end;
  };
  std::vector<entry> entries;
  std::vector<T> values;
  std::string text;
  std::size_t lineno = 0;
  const auto fail = [&](const std::string& what) {
    throw parse_error("cadence::read_push_history: " + std::string(source) + ":" +
                      std::to_string(lineno) + ": " + what);
  };
  while (std::getline(in, text)) {
    ++lineno;
    const std::string_view line = detail::trim_blanks(text);
    if (line.empty()) continue;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) fail("expected 'id:t1,t2,...,' but found no ':'");
    const std::string_view id_text = detail::trim_blanks(line.substr(0, colon));
    std::int64_t id = 0;
    if (!detail::parse_integer(id_text, id))
      fail("worker id '" + std::string(id_text) + "' is not an integer");
    std::string_view rest = line.substr(colon + 1);
    const std::size_t begin = values.size();
    std::size_t field = 0;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view tok = detail::trim_blanks(rest.substr(0, comma));
      ++field;
      const bool last_field = comma == std::string_view::npos;
      if (tok.empty()) {
        if (last_field) break;  // blanks after the trailing comma
        fail("worker " + std::to_string(id) + ": timestamp " + std::to_string(field) +
             " is empty");
      }
      T v{};
      if (!detail::parse_integer(tok, v))
        fail("worker " + std::to_string(id) + ": timestamp " + std::to_string(field) + " '" +
             std::string(tok) + "' is not an integer that fits the timestamp type");
      if (values.size() > begin && v < values.back())
        fail("worker " + std::to_string(id) + ": timestamp " + std::to_string(field) + " (" +
             std::string(tok) + ") is earlier than the one before it");
      values.push_back(v);
      if (last_field) break;
      rest = rest.substr(comma + 1);
    }
    if (values.size() == begin) fail("worker " + std::to_string(id) + " has no timestamps");
    entries.push_back({id, lineno, begin, values.size()});
  }
  if (in.bad()) {
    lineno = lineno + 1;
    fail("read error");
  }
  std::vector<std::size_t> order(entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return entries[a].id < entries[b].id; });
  std::vector<std::int64_t> ids;
  std::vector<T> sorted;
  std::vector<std::size_t> offsets{0};
  ids.reserve(entries.size());
  sorted.reserve(values.size());
  offsets.reserve(entries.size() + 1);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const entry& e = entries[order[k]];
    if (k > 0 && entries[order[k - 1]].id == e.id) {
      lineno = e.line;
      fail("duplicate worker id " + std::to_string(e.id) + " (first on line " +
           std::to_string(entries[order[k - 1]].line) + ")");
    }
    ids.push_back(e.id);
    sorted.insert(sorted.end(), values.begin() + static_cast<std::ptrdiff_t>(e.begin),
                  values.begin() + static_cast<std::ptrdiff_t>(e.end));
    offsets.push_back(sorted.size());
  }
  return push_history<T>(std::move(ids), std::move(sorted), std::move(offsets));
}

/// Reads a push history from a file; messages name the file. Throws parse_error when the
/// file cannot be opened.
template <class T = std::int64_t>
push_history<T> read_push_history_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw parse_error("cadence::read_push_history: cannot open '" + path + "'");
  return read_push_history<T>(in, path);
}

/// Writes h in the published format (`id:t1,...,tk,` per line, ascending id), which
/// read_push_history reads back unchanged.
template <class T>
void write_push_history(std::ostream& out, const push_history<T>& h) {
  std::string line;
  char buf[24];
  for (std::size_t p = 0; p < h.size(); ++p) {
    line.clear();
    auto res = std::to_chars(buf, buf + sizeof buf, h.ids()[p]);
    line.append(buf, res.ptr);
    line.push_back(':');
    for (const T v : h.row(p)) {
      res = std::to_chars(buf, buf + sizeof buf, v);
      line.append(buf, res.ptr);
      line.push_back(',');
    }
    line.push_back('\n');
    out << line;
  }
}

/// Writes h to a file; throws parse_error when the file cannot be written.
template <class T>
void write_push_history_file(const std::string& path, const push_history<T>& h) {
  std::ofstream out(path);
  if (!out) throw parse_error("cadence::write_push_history: cannot open '" + path + "'");
  write_push_history(out, h);
  if (!out) throw parse_error("cadence::write_push_history: error writing '" + path + "'");
}

}  // namespace cadence
