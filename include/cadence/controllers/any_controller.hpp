/// \file
/// \ingroup controllers
/// A type-erased synchronization controller, for trainers that choose the policy at run time
/// (from a config string, see make_controller.hpp) rather than at compile time.
#pragma once

#include <cadence/controllers/controller.hpp>
#include <cadence/core/error.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

/// Where a controller that synchronises in supersteps stands (ElasticBSP: free-running
/// monitoring, then a planned barrier). Read it with supersteps(c), for any controller.
struct superstep_status {
  /// Barriers completed so far.
  std::size_t barriers = 0;
  /// True while the current superstep is monitoring (no barrier planned yet): pushes made now
  /// are not bounded by the plan, so a report of superstep sizes must count them apart.
  bool monitoring = false;
};

namespace detail {
// The optional superstep queries, detected rather than required because only ElasticBSP has
// barriers of its own: cc.barriers() and cc.is_monitoring() (basic_elastic_bsp<P>, every P) ...
template <class C, class = void>
struct has_superstep_queries : std::false_type {};
template <class C>
struct has_superstep_queries<C, std::void_t<decltype(std::declval<const C&>().barriers()),
                                            decltype(std::declval<const C&>().is_monitoring())>>
    : std::bool_constant<std::is_convertible_v<decltype(std::declval<const C&>().barriers()), std::size_t> &&
                         std::is_convertible_v<decltype(std::declval<const C&>().is_monitoring()), bool>> {};
// ... or cc.supersteps() -> std::optional<superstep_status>, for wrappers that forward whatever
// the controller they hold reports (any_controller).
template <class C, class = void>
struct forwards_supersteps : std::false_type {};
template <class C>
struct forwards_supersteps<C, std::void_t<decltype(std::declval<const C&>().supersteps())>>
    : std::is_same<decltype(std::declval<const C&>().supersteps()), std::optional<superstep_status>> {};
}  // namespace detail

/// c's superstep status if its policy synchronises in supersteps, else nullopt (BSP, ASP, SSP
/// and DSSP: their waits end in releases, not in barriers the policy counts). Works alike for
/// a concrete controller and for one held by any_controller, whatever its predictor type.
template <class C>
std::optional<superstep_status> supersteps(const C& c) {
  if constexpr (detail::forwards_supersteps<C>::value) {
    return c.supersteps();
  } else if constexpr (detail::has_superstep_queries<C>::value) {
    return superstep_status{static_cast<std::size_t>(c.barriers()), static_cast<bool>(c.is_monitoring())};
  } else {
    (void)c;
    return std::nullopt;
  }
}

/// Holds any synchronization_controller by value. One virtual call per push on top of the
/// policy's own cost; use the concrete class directly when the policy is fixed at compile time.
/// Copying deep-copies the held controller. The concept's calls and supersteps() forward to
/// the held controller and throw what it throws, or invalid_parameter_error when empty.
class any_controller {
public:
  /// Empty, until a controller is assigned.
  any_controller() = default;

  /// Holds controller, any synchronization_controller, by value. Constrained (not a
  /// static_assert) so overloads taking any_controller or, say, a config string resolve as
  /// expected.
  template <class C, class = std::enable_if_t<!std::is_same_v<std::decay_t<C>, any_controller> &&
                                              is_synchronization_controller_v<std::decay_t<C>>>>
  any_controller(C&& controller)  // NOLINT: implicit on purpose, like std::function
      : self_(std::make_unique<model<std::decay_t<C>>>(std::forward<C>(controller))) {}

  ///@{
  /// A copy holds its own copy of the controller, state included; a moved-from
  /// any_controller is empty.
  any_controller(const any_controller& other) : self_(other.self_ ? other.self_->clone() : nullptr) {}
  any_controller(any_controller&&) noexcept = default;
  any_controller& operator=(const any_controller& other) {
    if (this != &other) self_ = other.self_ ? other.self_->clone() : nullptr;
    return *this;
  }
  any_controller& operator=(any_controller&&) noexcept = default;
  ///@}

  /// True when it holds a controller.
  explicit operator bool() const noexcept { return self_ != nullptr; }

  /// Worker p finished an iteration at time t: whether p proceeds, and whom the push released.
  decision push(worker_id p, timestamp t) { return self().push(p, t); }
  /// Forwards the hint that p will push soon (cadence::prefetch); a no-op when empty or when
  /// the held controller takes no hint.
  void prefetch(worker_id p) const noexcept {
    if (self_) self_->prefetch(p);
  }
  /// Removes worker p (it left or died); returns whom that released.
  span<const worker_id> remove_worker(worker_id p) { return self().remove_worker(p); }
  /// Adds a worker; returns its id, the next unused one.
  worker_id add_worker() { return self().add_worker(); }
  /// Worker ids issued so far, active or removed.
  std::size_t worker_capacity() const { return self().worker_capacity(); }
  /// Pushes worker p has made (a joiner starts at the slowest active clock).
  clock_value clock(worker_id p) const { return self().clock(p); }
  /// Whether p was issued and not removed.
  bool is_active(worker_id p) const { return self().is_active(p); }
  /// Whether p pushed and waits to be released.
  bool is_waiting(worker_id p) const { return self().is_waiting(p); }
  /// Workers issued and not removed.
  std::size_t active_workers() const { return self().active_workers(); }
  /// The slowest active worker's clock.
  clock_value min_clock() const { return self().min_clock(); }
  /// clock(p) - min_clock(): how far p is ahead of the slowest active worker.
  clock_value staleness(worker_id p) const { return self().staleness(p); }
  /// The largest staleness over active workers now.
  clock_value max_staleness() const { return self().max_staleness(); }
  /// Whom the waiting worker p waits for, so a timeout can name the stragglers.
  std::vector<worker_id> waiting_for(worker_id p) const { return self().waiting_for(p); }
  /// The config string that make_controller() parses back into this policy.
  std::string config() const { return self().config(); }
  /// The held controller's superstep status (see cadence::supersteps), nullopt if it has none.
  std::optional<superstep_status> supersteps() const { return self().supersteps(); }

  ///@{
  /// The held controller if it is a C (as std::function::target), else nullptr.
  template <class C>
  C* target() noexcept {
    auto* m = dynamic_cast<model<C>*>(self_.get());
    return m ? &m->value : nullptr;
  }
  template <class C>
  const C* target() const noexcept {
    auto* m = dynamic_cast<const model<C>*>(self_.get());
    return m ? &m->value : nullptr;
  }
  ///@}

private:
  struct concept_base;
  concept_base& self() const {
    if (!self_)
      throw invalid_parameter_error(
          "cadence::any_controller: empty (default-constructed or moved-from); assign a "
          "controller, e.g. make_controller(\"ssp:3\", workers)");
    return *self_;
  }

  struct concept_base {
    virtual ~concept_base() = default;
    virtual std::unique_ptr<concept_base> clone() const = 0;
    virtual decision push(worker_id, timestamp) = 0;
    virtual void prefetch(worker_id) const noexcept = 0;
    virtual span<const worker_id> remove_worker(worker_id) = 0;
    virtual worker_id add_worker() = 0;
    virtual std::size_t worker_capacity() const = 0;
    virtual clock_value clock(worker_id) const = 0;
    virtual bool is_active(worker_id) const = 0;
    virtual bool is_waiting(worker_id) const = 0;
    virtual std::size_t active_workers() const = 0;
    virtual clock_value min_clock() const = 0;
    virtual clock_value staleness(worker_id) const = 0;
    virtual clock_value max_staleness() const = 0;
    virtual std::vector<worker_id> waiting_for(worker_id) const = 0;
    virtual std::string config() const = 0;
    virtual std::optional<superstep_status> supersteps() const = 0;
  };

  template <class C>
  struct model final : concept_base {
    template <class U>
    explicit model(U&& v) : value(std::forward<U>(v)) {}
    std::unique_ptr<concept_base> clone() const override { return std::make_unique<model>(value); }
    decision push(worker_id p, timestamp t) override { return value.push(p, t); }
    void prefetch(worker_id p) const noexcept override { cadence::prefetch(value, p); }
    span<const worker_id> remove_worker(worker_id p) override { return value.remove_worker(p); }
    worker_id add_worker() override { return value.add_worker(); }
    std::size_t worker_capacity() const override { return value.worker_capacity(); }
    clock_value clock(worker_id p) const override { return value.clock(p); }
    bool is_active(worker_id p) const override { return value.is_active(p); }
    bool is_waiting(worker_id p) const override { return value.is_waiting(p); }
    std::size_t active_workers() const override { return value.active_workers(); }
    clock_value min_clock() const override { return value.min_clock(); }
    clock_value staleness(worker_id p) const override { return value.staleness(p); }
    clock_value max_staleness() const override { return value.max_staleness(); }
    std::vector<worker_id> waiting_for(worker_id p) const override { return value.waiting_for(p); }
    std::string config() const override { return value.config(); }
    std::optional<superstep_status> supersteps() const override { return cadence::supersteps(value); }
    C value;
  };

  std::unique_ptr<concept_base> self_;
};

/// @}
}  // namespace cadence
