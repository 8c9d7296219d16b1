import pytest
from support.readme import run_readme


@pytest.mark.usefixtures("standard_dtype_promotion")  # hk.dropout and BatchNorm need it
def test_readme_runs_and_trains() -> None:
    namespace = run_readme("ciclo-haiku")
    assert int(namespace["elapsed"].steps) == 80
    accuracy = namespace["history"].collect("accuracy_test")  # one per epoch
    assert len(accuracy) == 10 and accuracy[-1] > accuracy[0] + 0.2 and accuracy[-1] > 0.75, accuracy
