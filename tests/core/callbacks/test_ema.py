"""`ciclo.swap_ema_weights()`: train_loop's test loop evaluates with the EMA of the weights."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo


class Scale:
    """preds = w * x: its loss, the mean of the predictions, shows which weight a step used."""

    def init(self, key, inputs):
        return jnp.ones(()), None

    def apply(self, params, model_state, inputs, *, key, training):
        return params * inputs, model_state


def make(**options):
    return ciclo.create_model_state(
        Scale(), inputs=jnp.ones(1), tx=optax.sgd(0.1), losses=lambda preds: preds.mean(), **options
    )


DATA = [jnp.ones(1)] * 4


@pytest.mark.parametrize("given", ["callback", "test_with_ema"])
def test_the_test_loop_sees_the_ema_and_training_goes_on_with_the_trained_weights(given):
    options = {"callbacks": [ciclo.swap_ema_weights()]} if given == "callback" else {"test_with_ema": True}
    state, history, _ = ciclo.train_loop(
        make(ema_decay=0.5), DATA, test_dataset=lambda: DATA[:1], epoch_duration=2, **options
    )
    plain, _, _ = ciclo.train_loop(make(ema_decay=0.5), DATA, test_dataset=lambda: DATA[:1], epoch_duration=2)
    np.testing.assert_array_equal(np.asarray(state.params), np.asarray(plain.params))
    np.testing.assert_array_equal(np.asarray(state.ema_params), np.asarray(plain.ema_params))
    # The EMA after steps 2 and 4 (params 1, 0.9, 0.8, 0.7, 0.6; decay 0.5): 0.875 and 0.69375.
    np.testing.assert_allclose(history.collect("loss_test"), [0.875, 0.69375], rtol=1e-6)


def test_a_test_loop_with_no_batch_leaves_the_trained_weights():
    swap = ciclo.swap_ema_weights()
    state = make(ema_decay=0.5)
    with pytest.warns(ciclo.types.DataWarning, match="yielded no batch"):
        inner = ciclo.test_loop(state, [], callbacks=[swap])
    assert inner[0].params is state.params and inner[0].ema_params is state.ema_params


def test_a_state_without_an_ema_is_refused_before_the_first_step():
    steps = []
    with pytest.raises(ValueError, match=r"does not keep: create it with ema_decay="):
        ciclo.train_loop(
            make(),
            DATA,
            {ciclo.every(1): lambda elapsed: steps.append(elapsed.steps)},
            callbacks=[ciclo.swap_ema_weights()],
            test_dataset=lambda: DATA,
            epoch_duration=2,
        )
    assert steps == []
