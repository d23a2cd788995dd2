// The per-value arithmetic of a DiLoCo round, written once for the host engine (sync/diloco.hpp,
// sync/outer_optimizer.hpp) and the device round (cuda/diloco/), so that both give the same bits.
//
// Each float operation is rounded on its own (commsgd/rounded.hpp).
#pragma once

#include <commsgd/config.hpp>
#include <commsgd/rounded.hpp>

namespace commsgd::inline v1::sync::math {

using commsgd::detail::add_rn;
using commsgd::detail::div_rn;
using commsgd::detail::mul_rn;
using commsgd::detail::sub_rn;

// The sign of a pseudo-gradient, old minus new, so that it acts as a gradient: an outer step with a positive
// lr moves the common model toward the ranks' models. Every pseudo-gradient on host and device is this.
COMMSGD_HOST_DEVICE inline float delta(float global, float local) {
  return sub_rn(global, local);
}

// A rank's pseudo-gradient value scaled by the rank's weight; a weight of 1 leaves the bits of the difference.
COMMSGD_HOST_DEVICE inline float pseudo_gradient(float global, float local, float weight) {
  const float d = delta(global, local);
  return weight == 1.0f ? d : mul_rn(d, weight);
}

// The outer step on one value given the mean over the ranks, Nesterov SGD as PyTorch's SGD(nesterov=True)
// writes it: v <- mu v + mean, global <- global - lr (mean + mu v). Returns the new global value.
COMMSGD_HOST_DEVICE inline float nesterov_step(float global, float mean, float lr, float mu, float& v) {
  v = add_rn(mul_rn(mu, v), mean);
  return sub_rn(global, mul_rn(lr, add_rn(mean, mul_rn(mu, v))));
}
// The same without momentum (mu = 0): global - lr mean. Not nesterov_step with mu = 0, whose 0 v + mean
// would turn a mean of -0 into +0 (and write v).
COMMSGD_HOST_DEVICE inline float sgd_step(float global, float mean, float lr) {
  return sub_rn(global, mul_rn(lr, mean));
}

// The outer step from the sum over n ranks: mean = sum / n, then one of the two above (v untouched when
// mu = 0).
COMMSGD_HOST_DEVICE inline float outer_step(float global, float sum, float n, float lr, float mu, float* v) {
  const float mean = div_rn(sum, n);
  return mu == 0.0f ? sgd_step(global, mean, lr) : nesterov_step(global, mean, lr, mu, *v);
}

// The merge of the local value with the new common one: alpha = 0 restarts from the common model.
COMMSGD_HOST_DEVICE inline float merge(float global, float local, float alpha) {
  return alpha == 0.0f ? global : add_rn(global, mul_rn(alpha, sub_rn(local, global)));
}

// The merge that keeps the steps taken while the exchange travelled: the new common value plus what the local
// value moved since the exchange started (`start`). With no step between, local == start and the result is
// the common value's bits (alpha = 0's merge), its zero's sign included.
COMMSGD_HOST_DEVICE inline float carry(float global, float local, float start) {
  const float moved = sub_rn(local, start);
  return moved == 0.0f ? global : add_rn(global, moved);
}

} // namespace commsgd::inline v1::sync::math
