/// \file
/// \ingroup io
/// Reading and writing push histories in the ElasticBSP authors' published generator format:
/// one worker per line, `id:t1,t2,...,tk,` with integer millisecond timestamps (or decimal
/// numbers, read as floating point). Reading is bounded, so any input fails fast or fits.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <numeric>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace cadence {
/// \addtogroup io
/// @{

/// Push timestamps of n workers, ordered by ascending worker id; rows may differ in length
/// (each has at least one timestamp). Stored ragged: values plus n + 1 offsets, so rows()
/// is a zero-copy rows_view for ZipLine (of predicted times) or for predictors (per row).
/// T is an integer type for the published integer milliseconds (exact), or a floating-point
/// type for decimal timestamps (seconds with fractions, as the controllers take them).
template <class T = std::int64_t>
class push_history {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "cadence::push_history<T>: T must be an integer type (the published integer "
                "milliseconds) or a floating-point type (decimal timestamps)");

public:
  /// The timestamp type.
  using value_type = T;

  /// No workers.
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
  /// True when it holds no worker.
  bool empty() const noexcept { return ids_.empty(); }
  /// Worker ids, ascending; ids()[p] is the id of row p.
  const std::vector<std::int64_t>& ids() const noexcept { return ids_; }
  /// Timestamps of row p (the worker with the p-th smallest id).
  span<const T> row(std::size_t p) const noexcept {
    return span<const T>(values_.data() + offsets_[p], offsets_[p + 1] - offsets_[p]);
  }
  ///@{
  /// The ragged storage: row p is values()[offsets()[p]] up to values()[offsets()[p + 1]].
  const std::vector<T>& values() const noexcept { return values_; }
  const std::vector<std::size_t>& offsets() const noexcept { return offsets_; }
  ///@}
  /// All rows as a ragged rows_view (valid while this object lives and is not modified).
  rows_view<T> rows() const noexcept {
    return rows_view<T>::ragged(values_.data(), offsets_.data(), ids_.size());
  }

  ///@{
  /// Equal when a and b hold the same ids with the same timestamps.
  friend bool operator==(const push_history& a, const push_history& b) {
    return a.ids_ == b.ids_ && a.values_ == b.values_ && a.offsets_ == b.offsets_;
  }
  friend bool operator!=(const push_history& a, const push_history& b) { return !(a == b); }
  ///@}

private:
  std::vector<std::int64_t> ids_;
  std::vector<T> values_;
  std::vector<std::size_t> offsets_{0};
};

/// Default bounds of the push-history readers. They keep a file that is not a push history
/// (/dev/zero, a binary, one endless line) from exhausting memory: it fails within one line.
/// Bytes per line: 64 MiB, about five million timestamps for one worker.
inline constexpr std::size_t push_history_max_line_length = std::size_t{1} << 26;
/// Workers (lines that hold one).
inline constexpr std::size_t push_history_max_workers = 10'000'000;
/// Timestamps of all workers together: 1.6 GB as 64-bit values.
inline constexpr std::size_t push_history_max_timestamps = 200'000'000;

/// How read_push_history reads; each violation is a parse_error naming the source, the line
/// and the bound.
struct push_history_read_options {
  std::size_t max_line_length = push_history_max_line_length;  ///< bytes, line end excluded
  std::size_t max_workers = push_history_max_workers;  ///< lines that hold a worker
  std::size_t max_timestamps = push_history_max_timestamps;  ///< over all workers
  /// Fewest timestamps a worker may have (>= 1); a predictor needs min_history() of them.
  std::size_t min_timestamps = 1;
  /// Rows must be strictly increasing (predicted push times, as ZipLine takes them) instead
  /// of only non-decreasing (a recorded history may hold two pushes in one millisecond).
  bool strictly_increasing = false;
};

namespace detail {

inline std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

/// Drops one leading '+' (from_chars takes none), but not from "+-5", which is no number.
inline std::string_view strip_plus(std::string_view s) {
  if (s.size() > 1 && s.front() == '+' && s[1] != '-') s.remove_prefix(1);
  return s;
}

template <class I>
bool parse_integer(std::string_view s, I& out) {
  s = strip_plus(s);
  const auto res = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && res.ec == std::errc() && res.ptr == s.data() + s.size();
}

/// "a 64-bit signed integer", "a double", ...: what a timestamp that does not fit must fit.
template <class T>
std::string timestamp_type_name() {
  if constexpr (std::is_same_v<T, float>) return "a float";
  else if constexpr (std::is_same_v<T, double>) return "a double";
  else if constexpr (std::is_same_v<T, long double>) return "a long double";
  else
    return "a " + std::to_string(std::numeric_limits<T>::digits + (std::is_signed_v<T> ? 1 : 0)) +
           "-bit " + (std::is_signed_v<T> ? "signed" : "unsigned") + " integer";
}

/// Splits the published format into workers and timestamp texts, within the read options'
/// bounds. Lines are read in blocks and checked before they are stored, so neither an endless
/// line nor a file of NUL bytes is ever held in memory whole. The typed readers turn each
/// text into a value.
class push_history_scanner {
public:
  push_history_scanner(std::istream& in, std::string_view source,
                       const push_history_read_options& options)
      : in_(in), source_(source), options_(options), block_(std::size_t{1} << 16, '\0') {}

  /// Moves to the next line that holds a worker and reads its id; false at the end.
  bool next_worker() {
    for (;;) {
      if (!read_line()) return false;
      const std::string_view line = trim_blanks(line_);
      if (line.empty()) continue;
      const auto colon = line.find(':');
      if (colon == std::string_view::npos) fail("expected 'id:t1,t2,...,' but found no ':'");
      const std::string_view id_text = trim_blanks(line.substr(0, colon));
      if (!parse_integer(id_text, id_))
        fail("worker id '" + std::string(id_text) + "' is not an integer");
      if (workers_ == options_.max_workers)
        fail("more than " + std::to_string(options_.max_workers) +
             " workers (the reader's max_workers)");
      ++workers_;
      rest_ = line.substr(colon + 1);
      more_ = true;
      field_ = 0;
      return true;
    }
  }

  /// The current worker's next timestamp text, blanks trimmed; false after its last one.
  bool next_timestamp(std::string_view& text) {
    if (!more_) return false;
    const auto comma = rest_.find(',');
    text = trim_blanks(rest_.substr(0, comma));
    more_ = comma != std::string_view::npos;
    rest_ = more_ ? rest_.substr(comma + 1) : std::string_view();
    if (text.empty()) {
      if (!more_) return false;  // nothing (or blanks) after the trailing comma
      fail("worker " + std::to_string(id_) + ": timestamp " + std::to_string(field_ + 1) +
           " is empty");
    }
    if (timestamps_ == options_.max_timestamps)
      fail("more than " + std::to_string(options_.max_timestamps) +
           " timestamps in all (the reader's max_timestamps)");
    ++timestamps_;
    ++field_;
    return true;
  }

  std::int64_t id() const noexcept { return id_; }
  /// 1-based line number of the current worker.
  std::size_t line() const noexcept { return lineno_; }
  /// 1-based index of the current worker's last timestamp read.
  std::size_t field() const noexcept { return field_; }
  const push_history_read_options& options() const noexcept { return options_; }

  /// Throws "cadence::read_push_history: SOURCE:LINE: what" for the current line.
  [[noreturn]] void fail(const std::string& what) const { fail_at(lineno_, what); }
  [[noreturn]] void fail_at(std::size_t line, const std::string& what) const {
    throw parse_error("cadence::read_push_history: " + source_ + ":" + std::to_string(line) +
                      ": " + what);
  }
  /// Fails for the current worker's current timestamp: "worker ID: timestamp K 'TEXT' what".
  [[noreturn]] void fail_timestamp(std::string_view text, const std::string& what) const {
    fail("worker " + std::to_string(id_) + ": timestamp " + std::to_string(field_) + " '" +
         std::string(text) + "' " + what);
  }

private:
  /// Reads the next line into line_ (without its '\n'); false when the input has ended.
  bool read_line() {
    line_.clear();
    ++lineno_;
    bool any = false;
    for (;;) {
      if (pos_ == end_) {
        if (at_end_) return any;
        in_.read(&block_[0], static_cast<std::streamsize>(block_.size()));
        if (in_.bad()) fail("read error");
        end_ = static_cast<std::size_t>(in_.gcount());
        pos_ = 0;
        at_end_ = in_.eof() || end_ == 0;
        if (end_ == 0) return any;
      }
      const char* const begin = block_.data() + pos_;
      const auto available = end_ - pos_;
      const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', available));
      const std::size_t take = newline ? static_cast<std::size_t>(newline - begin) : available;
      if (const auto* nul = static_cast<const char*>(std::memchr(begin, '\0', take)))
        fail("NUL byte at column " +
             std::to_string(line_.size() + static_cast<std::size_t>(nul - begin) + 1) +
             ": a push history is text");
      if (take > options_.max_line_length - line_.size())
        fail("line is longer than " + std::to_string(options_.max_line_length) +
             " bytes (the reader's max_line_length)");
      line_.append(begin, take);
      any = true;
      pos_ += take;
      if (newline) {
        ++pos_;
        return true;
      }
    }
  }

  std::istream& in_;
  std::string source_;
  const push_history_read_options& options_;
  std::string block_, line_;
  std::size_t pos_ = 0, end_ = 0;
  bool at_end_ = false;
  std::size_t lineno_ = 0, workers_ = 0, timestamps_ = 0, field_ = 0;
  std::int64_t id_ = 0;
  std::string_view rest_;
  bool more_ = false;
};

/// Parses one timestamp text as T or fails naming it: integers must be integers that fit T;
/// floating point accepts decimals and exponents but not NaN, infinities or overflow.
template <class T>
T parse_timestamp(const push_history_scanner& s, std::string_view text) {
  T v{};
  const std::string_view digits = strip_plus(text);
  const char* const end = digits.data() + digits.size();
  const auto res = std::from_chars(digits.data(), end, v);
  const bool whole = !digits.empty() && res.ptr == end;
  if (whole && res.ec == std::errc::result_out_of_range)
    s.fail_timestamp(text, "does not fit " + timestamp_type_name<T>());
  if constexpr (std::is_integral_v<T>) {
    if (!whole || res.ec != std::errc()) s.fail_timestamp(text, "is not an integer");
  } else {
    if (!whole || res.ec != std::errc()) s.fail_timestamp(text, "is not a number");
    if (!std::isfinite(v)) s.fail_timestamp(text, "is not a finite number");
  }
  return v;
}

/// Where one worker's row lies in the values read so far.
struct push_history_entry {
  std::int64_t id;
  std::size_t line, begin, end;
};

/// Checks the row rule between the current worker's timestamp v (written as text) and the
/// one before it, prev (written as prev_text); messages quote both as written.
template <class T>
void check_timestamp_order(const push_history_scanner& s, T prev, std::string_view prev_text,
                           T v, std::string_view text) {
  const bool backwards = v < prev;
  if (!backwards && !(s.options().strictly_increasing && !(prev < v))) return;
  s.fail("worker " + std::to_string(s.id()) + ": timestamp " + std::to_string(s.field()) + " (" +
         std::string(text) + ") " + (backwards ? "is earlier than" : "is not later than") +
         " timestamp " + std::to_string(s.field() - 1) + " (" + std::string(prev_text) + "); " +
         (backwards ? "timestamps must not go backwards"
                    : "timestamps must be strictly increasing"));
}

/// Checks that the worker that just ended has at least min_timestamps of them.
inline void check_row_length(const push_history_scanner& s, std::size_t count) {
  if (count == 0) s.fail("worker " + std::to_string(s.id()) + " has no timestamps");
  const std::size_t least = s.options().min_timestamps;
  if (count < least)
    s.fail("worker " + std::to_string(s.id()) + " has " + std::to_string(count) +
           (count == 1 ? " timestamp" : " timestamps") + "; at least " + std::to_string(least) +
           " are required");
}

/// Orders the rows by worker id (rejecting a duplicate id, naming both lines) and builds the
/// history. Rows already in id order, as the authors' generator writes them, are not copied.
template <class T>
push_history<T> sort_push_history(const push_history_scanner& s,
                                  const std::vector<push_history_entry>& entries,
                                  std::vector<T>&& values) {
  std::vector<std::size_t> order(entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return entries[a].id < entries[b].id; });
  std::vector<std::int64_t> ids;
  std::vector<std::size_t> offsets{0};
  ids.reserve(entries.size());
  offsets.reserve(entries.size() + 1);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const push_history_entry& e = entries[order[k]];
    if (k > 0 && entries[order[k - 1]].id == e.id)
      s.fail_at(e.line, "duplicate worker id " + std::to_string(e.id) + " (first on line " +
                            std::to_string(entries[order[k - 1]].line) + ")");
    ids.push_back(e.id);
    offsets.push_back(offsets.back() + (e.end - e.begin));
  }
  bool in_order = true;
  for (std::size_t k = 0; k < order.size(); ++k) in_order = in_order && order[k] == k;
  if (in_order) return push_history<T>(std::move(ids), std::move(values), std::move(offsets));
  std::vector<T> sorted;
  sorted.reserve(values.size());
  for (const std::size_t k : order)
    sorted.insert(sorted.end(), values.begin() + static_cast<std::ptrdiff_t>(entries[k].begin),
                  values.begin() + static_cast<std::ptrdiff_t>(entries[k].end));
  return push_history<T>(std::move(ids), std::move(sorted), std::move(offsets));
}

}  // namespace detail

/// Reads a push history. Format, one worker per line: `id:t1,t2,...,tk,` where id is a
/// decimal integer and the timestamps are decimal integers (integer T) or decimal numbers
/// such as `1.25` or `2e3` (floating-point T; NaN and infinities are rejected). Blanks
/// around fields are ignored, the trailing comma is optional, blank lines are skipped and
/// CRLF line ends are accepted. Every worker needs at least options.min_timestamps
/// timestamps and its timestamps must not decrease (must increase with
/// options.strictly_increasing). Throws parse_error "cadence::read_push_history:
/// SOURCE:LINE: what was wrong" for a malformed line, a value that does not fit T, a
/// duplicate id (naming both lines) or input beyond the options' bounds. `source` names the
/// input in messages.
template <class T = std::int64_t>
push_history<T> read_push_history(std::istream& in, std::string_view source = "<stream>",
                                  const push_history_read_options& options = {}) {
  detail::push_history_scanner s(in, source, options);
  std::vector<detail::push_history_entry> entries;
  std::vector<T> values;
  while (s.next_worker()) {
    const std::size_t begin = values.size();
    std::string_view text, prev_text;
    while (s.next_timestamp(text)) {
      const T v = detail::parse_timestamp<T>(s, text);
      if (values.size() > begin) detail::check_timestamp_order(s, values.back(), prev_text, v, text);
      values.push_back(v);
      prev_text = text;
    }
    detail::check_row_length(s, values.size() - begin);
    entries.push_back({s.id(), s.line(), begin, values.size()});
  }
  return detail::sort_push_history(s, entries, std::move(values));
}

/// A history whose timestamp type follows the input: see read_any_push_history.
using any_push_history = std::variant<push_history<std::int64_t>, push_history<double>>;

/// Reads a push history (format and errors as read_push_history) with the timestamp type the
/// input asks for: integer milliseconds, the published format, stay exact in
/// push_history<std::int64_t>; as soon as one timestamp is written as a decimal (with a '.'
/// or an exponent: `1.25`, `2e3`) every timestamp is read as a double. One pass, so pipes
/// work too. An integer that does not fit 64 bits is an error in an integer file only.
/// `source` names the input in messages; `options` bound it as for read_push_history.
inline any_push_history read_any_push_history(std::istream& in,
                                              std::string_view source = "<stream>",
                                              const push_history_read_options& options = {}) {
  detail::push_history_scanner s(in, source, options);
  std::vector<detail::push_history_entry> entries;
  std::vector<std::int64_t> integers;
  std::vector<double> reals;
  bool real = false;     // values live in reals
  bool decimal = false;  // some timestamp is written as a decimal
  // The first integer too large for 64 bits: the values move to doubles (a decimal may still
  // follow), and it is the error if none does.
  std::size_t huge_line = 0;
  std::string huge_what;
  while (s.next_worker()) {
    const std::size_t begin = real ? reals.size() : integers.size();
    std::string_view text, prev_text;
    while (s.next_timestamp(text)) {
      const bool looks_decimal = text.find_first_of(".eE") != std::string_view::npos;
      if (!real && !looks_decimal) {
        std::int64_t v;
        if (detail::parse_integer(text, v)) {
          if (integers.size() > begin)
            detail::check_timestamp_order(s, integers.back(), prev_text, v, text);
          integers.push_back(v);
          prev_text = text;
          continue;
        }
      }
      // Also the better message for text that is no integer: "is not a (finite) number".
      const double v = detail::parse_timestamp<double>(s, text);
      decimal = decimal || looks_decimal;
      if (!real) {
        if (!looks_decimal) {
          huge_line = s.line();
          huge_what = "worker " + std::to_string(s.id()) + ": timestamp " +
                      std::to_string(s.field()) + " '" + std::string(text) + "' does not fit " +
                      detail::timestamp_type_name<std::int64_t>() +
                      " (integer timestamps are read exactly)";
        }
        reals.assign(integers.begin(), integers.end());
        integers = std::vector<std::int64_t>();
        real = true;
      }
      if (reals.size() > begin) detail::check_timestamp_order(s, reals.back(), prev_text, v, text);
      reals.push_back(v);
      prev_text = text;
    }
    const std::size_t end = real ? reals.size() : integers.size();
    detail::check_row_length(s, end - begin);
    entries.push_back({s.id(), s.line(), begin, end});
  }
  if (real && !decimal) s.fail_at(huge_line, huge_what);
  if (real) return detail::sort_push_history(s, entries, std::move(reals));
  return detail::sort_push_history(s, entries, std::move(integers));
}

/// Reads a push history from the file at path, within options' bounds; messages name the
/// file. Throws parse_error when the file cannot be opened.
template <class T = std::int64_t>
push_history<T> read_push_history_file(const std::string& path,
                                       const push_history_read_options& options = {}) {
  std::ifstream in(path);
  if (!in) throw parse_error("cadence::read_push_history: cannot open '" + path + "'");
  return read_push_history<T>(in, path, options);
}

/// read_any_push_history from the file at path, within options' bounds; messages name the
/// file. Throws parse_error when the file cannot be opened.
inline any_push_history read_any_push_history_file(const std::string& path,
                                                   const push_history_read_options& options = {}) {
  std::ifstream in(path);
  if (!in) throw parse_error("cadence::read_push_history: cannot open '" + path + "'");
  return read_any_push_history(in, path, options);
}

/// Writes h to out in the published format (`id:t1,...,tk,` per line, ascending id), which
/// read_push_history<T> reads back unchanged: floating-point values in their shortest
/// round-trip form (a whole number as an integer, so read_any_push_history may read it back
/// as integers).
template <class T>
void write_push_history(std::ostream& out, const push_history<T>& h) {
  std::string line;
  char buf[64];  // the longest shortest form of any arithmetic type (long double) fits
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

/// Writes h to the file at path (replacing it); throws parse_error when the file cannot be
/// written.
template <class T>
void write_push_history_file(const std::string& path, const push_history<T>& h) {
  std::ofstream out(path);
  if (!out) throw parse_error("cadence::write_push_history: cannot open '" + path + "'");
  write_push_history(out, h);
  if (!out) throw parse_error("cadence::write_push_history: error writing '" + path + "'");
}

/// @}
}  // namespace cadence
