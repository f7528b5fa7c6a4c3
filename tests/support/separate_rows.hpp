// The same rows as any rows_view, each copied into its own allocation and seen through
// rows_view::separate, so tests can run every variant on that layout too.
#pragma once

#include <cadence/zipline/rows.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace cadence::test {

template <class T>
class separate_rows {
public:
  explicit separate_rows(rows_view<T> rows) : offsets_{0} {
    for (std::size_t p = 0; p < rows.size(); ++p) {
      const auto row = rows[p];
      // One heap block per row, none shared: a search that assumed contiguous rows would read
      // another block (AddressSanitizer builds catch it) or wrong values.
      storage_.push_back(std::make_unique<T[]>(row.size()));
      std::copy(row.begin(), row.end(), storage_.back().get());
      pointers_.push_back(storage_.back().get());
      offsets_.push_back(offsets_.back() + row.size());
    }
  }
  separate_rows(const separate_rows&) = delete;
  separate_rows& operator=(const separate_rows&) = delete;
  rows_view<T> view() const {
    return rows_view<T>::separate(pointers_.data(), offsets_.data(), pointers_.size());
  }

private:
  std::vector<std::unique_ptr<T[]>> storage_;
  std::vector<const T*> pointers_;
  std::vector<std::size_t> offsets_;
};

}  // namespace cadence::test
