"""Host values as JSON data, tagged (`{"$tuple": [...]}`): what a backup stores besides its state.

`from_json` checks every tag and value and never runs code from the data. A
tree shaped like the loop state goes to `kept`, saved by orbax, as `{"$state": "0"}`.
"""

from __future__ import annotations

import base64
import math
import typing
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ciclo._src.base.reprs import cut, short

_TAGS = ("$array", "$bytes", "$dict", "$float", "$key", "$state", "$tuple")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def to_json(
    value: Any, where: str, *, state_structure: Any = None, kept: dict[str, Any] | None = None
) -> Any:
    """`value` as JSON data; raises TypeError naming `where` for a value that is not data.

    Example:
        >>> import numpy as np
        >>> data = to_json({"best": np.float32(0.5), "steps": (1, 2)}, "state")
        >>> data["steps"]
        {'$tuple': [1, 2]}
        >>> from_json(data, "state")["best"]
        np.float32(0.5)
    """

    def inner(v: Any, at: str) -> Any:
        return to_json(v, at, state_structure=state_structure, kept=kept)

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, np.generic):
        return int(value)
    if isinstance(value, float) and not isinstance(value, np.generic):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if (
        kept is not None
        and state_structure is not None
        and not isinstance(value, (list, tuple, dict, bytes, np.ndarray, np.generic, jax.Array))
        and jax.tree.structure(value) == state_structure
    ):
        name = str(len(kept))
        kept[name] = value
        return {"$state": name}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(value))
        return {"$key": {"impl": impl, "data": to_json(_host_array(jax.random.key_data(value)), where)}}
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        array = _host_array(value)
        if not _is_data_dtype(array.dtype):
            raise TypeError(
                f"{cut(where)} is an array of dtype {array.dtype}, which a backup cannot hold as data"
            )
        return {
            "$array": {
                "dtype": array.dtype.name,
                "shape": list(array.shape),
                "scalar": isinstance(value, np.generic),
                "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii"),
            }
        }
    if isinstance(value, (tuple, list)):
        items = [inner(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return {"$tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if all(isinstance(key, str) and not key.startswith("$") for key in value):
            return {key: inner(v, f"{where}[{short(key)}]") for key, v in value.items()}
        pairs = [
            [to_json(key, f"{where} key {short(key)}"), inner(v, f"{where}[{short(key)}]")]
            for key, v in value.items()
        ]
        return {"$dict": pairs}
    raise TypeError(
        f"{cut(where)} is of type {type(value).__name__}, which a backup cannot hold: a backup holds "
        "numbers, strings, bytes, lists, tuples, dicts and arrays (and trees shaped like the loop's state), "
        "never objects"
    )


def from_json(data: Any, where: str, *, states: Mapping[str, Any] | None = None) -> Any:
    """The value `to_json` encoded; raises ValueError naming `where` for data it did not write."""

    def inner(v: Any, at: str) -> Any:
        return from_json(v, at, states=states)

    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [inner(v, f"{where}[{i}]") for i, v in enumerate(data)]
    if not isinstance(data, dict):
        raise ValueError(f"{cut(where)} holds a {type(data).__name__}, which no backup writes")
    tags = [key for key in data if key.startswith("$")]
    if not tags:
        return {key: inner(v, f"{where}[{short(key)}]") for key, v in data.items()}
    if len(data) != 1 or tags[0] not in _TAGS:
        raise ValueError(f"{cut(where)} holds unknown fields {short(sorted(data)[:5])}")
    tag, body = tags[0], data[tags[0]]
    if tag == "$tuple":
        return tuple(inner(_list(body, where), where))
    if tag == "$dict":
        pairs = _list(body, where)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            raise ValueError(f"{cut(where)} holds a $dict whose items are not [key, value] pairs")
        try:
            return {inner(k, f"{where} key"): inner(v, f"{where}[{short(k)}]") for k, v in pairs}
        except TypeError:  # from_json raises only ValueError: a key that is a list, a dict or an array
            raise ValueError(f"{cut(where)} holds a dict key that is not hashable") from None
    if tag == "$float":
        if body not in _NON_FINITE:
            raise ValueError(f"{cut(where)} holds a $float of {short(body)}, not nan, inf or -inf")
        return _NON_FINITE[body]
    if tag == "$bytes":
        return _base64(body, where)
    if tag == "$state":
        if states is None or body not in states:
            raise ValueError(
                f"{cut(where)} refers to a kept state {short(body)} that the backup does not hold"
            )
        return states[body]
    if tag == "$key":
        check_document(body, _KEY, f"{cut(where)} $key")
        key_data = from_json(body["data"], f"{where} key data")
        try:
            return jax.random.wrap_key_data(jnp.asarray(key_data), impl=body["impl"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{cut(where)} holds a $key of impl {short(body['impl'])}, which JAX does not know "
                "(or whose key data does not fit it)"
            ) from None
    return _array(body, where)


# A field: None (anything), or (the type it holds, what else must hold of it or None, what it is in
# words); a name ending in `?`: the field may be absent or null.
Schema = dict[str, tuple[type, Any, str] | None]


def check_document(item: Any, schema: Schema, where: str) -> dict[str, Any]:
    """`item`, refused unless it is a JSON object with the fields of `schema`, each as it describes."""
    fields = {name.rstrip("?"): name.endswith("?") for name in schema}
    if not isinstance(item, dict):
        raise ValueError(
            f"{where} holds a {type(item).__name__}, not a JSON object with the fields {list(fields)}"
        )
    for name, spec in zip(fields, schema.values(), strict=True):
        if spec is None or item.get(name) is None and (fields[name] or name not in item):
            continue  # anything, read by its own reader; or an optional field (or one missing: below)
        kind, check, what = spec
        value = item[name]
        if not isinstance(value, kind) or type(value) is bool is not kind or (check and not check(value)):
            shown = short(value) if isinstance(value, kind) else f"a {type(value).__name__}"
            raise ValueError(f"{where}: {name} is {shown}, not {what}")
    unknown = sorted(set(item) - set(fields))
    missing = sorted(name for name, optional in fields.items() if not optional and name not in item)
    if unknown or missing:
        raise ValueError(f"{where}: unknown fields {unknown}, missing fields {missing}")
    return item


_KEY: Schema = {"impl": (str, None, "the name of a PRNG implementation"), "data": None}
_ARRAY: Schema = {
    "dtype": (str, None, "the name of a dtype"),  # a dict or list would describe a structured dtype
    "shape": (list, lambda x: all(type(n) is int and n >= 0 for n in x), "a list of sizes"),
    "scalar": (bool, None, "true or false"),
    "data": (str, None, "base64 text"),
}


def _host_array(value: Any) -> np.ndarray:
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(value)


def _array(body: Any, where: str) -> np.ndarray | np.generic:
    shape = check_document(body, _ARRAY, f"{cut(where)} $array")["shape"]
    try:
        dtype = np.dtype(jnp.dtype(body["dtype"]))
    except (TypeError, ValueError):
        raise ValueError(f"{cut(where)} holds an $array of unknown dtype {short(body['dtype'])}") from None
    if not _is_data_dtype(dtype):
        raise ValueError(f"{cut(where)} holds an $array of dtype {cut(str(dtype))}, which no backup writes")
    raw = _base64(body["data"], where)
    if len(raw) != dtype.itemsize * math.prod(shape):
        raise ValueError(
            f"{cut(where)} holds {len(raw)} bytes, not those of a {dtype} array of shape "
            f"{short(tuple(shape))}"
        )
    array: np.ndarray = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if body["scalar"] and not shape:
        return typing.cast(np.generic, array[()])
    return array


def _is_data_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "biufc" or jnp.issubdtype(dtype, jnp.floating)


def _base64(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{cut(where)} holds {type(text).__name__} where base64 text belongs")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError:
        raise ValueError(f"{cut(where)} holds text that is not base64") from None


def _list(body: Any, where: str) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError(f"{cut(where)} holds a {type(body).__name__} where a list belongs")
    return body
