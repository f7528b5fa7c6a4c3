// What the command-line benchmarks (cadence-bench-transport, -exchange, -ps) print, in one
// place: a result is a list of rows, each an ordered JSON object whose keys are the JSON and
// CSV keys (docs/tools.md lists them); the table shows the columns a benchmark names. --json
// prints the rows as one array, --csv as a header and a line per row, and otherwise the table.
// Not part of the library.
#pragma once

#include "command_line.hpp"
#include "json.hpp"  // tools/json.hpp

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace cadence_bench {

/// One measured row: {"backend": ..., "op": ..., "bytes": ..., ...}, keys in print order.
using row = cadence::tools::json;

/// A column of the table: its heading, its width (negative: left-aligned) and its cell.
struct column {
  std::string header;
  int width = 10;
  std::function<std::string(const row&)> cell;
};

/// printf of one number ("%.2f", "%8.1f%%") as a string.
inline std::string formatted(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

/// A column that prints row[key] (a number) with printf's `fmt`.
inline column number_column(std::string header, int width, std::string key, const char* fmt) {
  return {std::move(header), width, [key, fmt](const row& r) { return formatted(fmt, r.at(key).get<double>()); }};
}

/// A column that prints scale * row[top] / row[bottom] with printf's `fmt`: a ratio of two
/// measurements ("ours/raw").
inline column ratio_column(std::string header, int width, std::string top, std::string bottom, const char* fmt,
                           double scale = 1) {
  return {std::move(header), width, [=](const row& r) {
            return formatted(fmt, scale * r.at(top).get<double>() / r.at(bottom).get<double>());
          }};
}

/// A column that prints row[key] as it is (a string, or an integer).
inline column text_column(std::string header, int width, std::string key) {
  return {std::move(header), width, [key](const row& r) {
            const auto& v = r.at(key);
            return v.is_string() ? v.get<std::string>() : v.dump();
          }};
}

/// The columns every raw-against-ours table has, in this order: bytes, the raw and ours times in
/// microseconds (printf's `us_fmt`, `width` wide), then the raw and ours rates (row keys
/// raw_<rate_key> and ours_<rate_key>, headings "raw <rate_header>" and "ours <rate_header>").
inline std::vector<column> raw_ours_columns(int width, const char* us_fmt, const std::string& rate_header,
                                            const std::string& rate_key) {
  return {text_column("bytes", width, "bytes"), number_column("raw us", width, "raw_us", us_fmt),
          number_column("ours us", width, "ours_us", us_fmt),
          number_column("raw " + rate_header, 10, "raw_" + rate_key, "%.3f"),
          number_column("ours " + rate_header, 10, "ours_" + rate_key, "%.3f")};
}

/// The end of a table's title under --security-cost (`on`): what raw and ours are for `op`
/// ("push_pull", "all-reduce"); empty without it.
inline std::string security_cost_note(bool on, const std::string& op) {
  return on ? "; --security-cost: raw = the same " + op + " over an open communicator, ours = authenticated and "
              "encrypted (CURVE)"
            : "";
}

/// The table: a title line, the headings, a line per row. A row for which `remark` returns
/// text shows its first `remark_after` cells and then that text instead of the others.
struct table {
  std::string title;
  std::vector<column> columns;
  std::function<std::string(const row&)> remark;
  std::size_t remark_after = 0;
};

namespace detail {

inline std::string padded(const std::string& text, int width) {
  const auto w = static_cast<std::size_t>(width < 0 ? -width : width);
  if (text.size() >= w) return text;
  const std::string fill(w - text.size(), ' ');
  return width < 0 ? text + fill : fill + text;
}

inline std::string csv_cell(const row& v) {
  if (v.is_null()) return "";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace detail

/// The table as text.
inline std::string table_text(const table& t, const std::vector<row>& rows) {
  std::string out = t.title + "\n";
  for (std::size_t k = 0; k < t.columns.size(); ++k)
    out += (k ? " " : "") + detail::padded(t.columns[k].header, t.columns[k].width);
  out += "\n";
  for (const row& r : rows) {
    const std::string note = t.remark ? t.remark(r) : std::string();
    const std::size_t shown = note.empty() ? t.columns.size() : t.remark_after;
    for (std::size_t k = 0; k < shown; ++k)
      out += (k ? " " : "") + detail::padded(t.columns[k].cell(r), t.columns[k].width);
    if (!note.empty()) out += "  " + note;
    out += "\n";
  }
  return out;
}

/// The rows as CSV: the keys of every row in the order they first appear, then a line per
/// row (a key a row lacks, or null, is an empty cell).
inline std::string csv_text(const std::vector<row>& rows) {
  std::vector<std::string> keys;
  for (const row& r : rows)
    for (const auto& item : r.items())
      if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) keys.push_back(item.key());
  std::string out;
  for (std::size_t k = 0; k < keys.size(); ++k) out += (k ? "," : "") + keys[k];
  out += "\n";
  for (const row& r : rows) {
    for (std::size_t k = 0; k < keys.size(); ++k)
      out += (k ? "," : "") + (r.contains(keys[k]) ? detail::csv_cell(r.at(keys[k])) : std::string());
    out += "\n";
  }
  return out;
}

/// Prints the rows on stdout as cfg asks: one JSON array (--json), CSV (--csv) or the table.
inline void print(const std::vector<row>& rows, const common_config& cfg, const table& t) {
  std::string text;
  if (cfg.json) {
    auto doc = cadence::tools::json::array();
    for (const row& r : rows) doc.push_back(r);
    text = cadence::tools::json_document(doc);
  } else if (cfg.csv) {
    text = csv_text(rows);
  } else {
    text = table_text(t, rows);
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace cadence_bench
