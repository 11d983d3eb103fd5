"""Comparison tables: a metric pivoted over setting axes, and frames as Markdown (``specdec.results``'s table
writer, which the benches use too)."""

from __future__ import annotations

import math

import pandas as pd

from analysis.load import ResultsError
from analysis.summarize import format_value
from specdec.results import markdown_table


def pivot_metric(data: pd.DataFrame, metric: str, rows: str | list[str], cols: str | list[str] | None = None
                 ) -> pd.DataFrame:
    """`metric` over setting axes `rows` x `cols` (cols=None: one column).

    `data` is a summary (then "speedup" means "speedup_mean") or a per-prompt frame (cells are the mean
    over prompts). Every cell must hold one run: a cell holding several means another axis varies too.
    """
    rows, cols = _as_list(rows), _as_list(cols)
    column = resolve_metric(data, metric)
    for axis in rows + cols:
        if axis not in data.columns:
            raise ResultsError(f"no column {axis!r} to pivot on; columns: {', '.join(map(str, data.columns))}")
    check_one_run_per_cell(data, rows + cols)
    # pandas drops NaN group keys; an option's parameter is NaN for the other options, so name it instead.
    data = data.assign(**{axis: data[axis].astype(object).where(data[axis].notna(), "n/a") for axis in rows + cols})
    if not cols:
        return data.groupby(rows, sort=True)[column].mean().to_frame(column)
    return data.pivot_table(values=column, index=rows, columns=cols, aggfunc="mean", sort=True)


def _as_list(axes) -> list[str]:
    if axes is None:
        return []
    return [axes] if isinstance(axes, str) else list(axes)


def resolve_metric(data: pd.DataFrame, metric: str) -> str:
    """The column holding `metric`: itself, or `<metric>_mean` in a summary."""
    for column in (metric, f"{metric}_mean"):
        if column in data.columns and pd.api.types.is_numeric_dtype(data[column]):
            return column
    numeric = [str(c) for c in data.columns if pd.api.types.is_numeric_dtype(data[c])]
    raise ResultsError(f"no numeric column for metric {metric!r}; numeric columns: {', '.join(numeric)}")


def check_one_run_per_cell(data: pd.DataFrame, axes: list[str]) -> None:
    runs_per_cell = data.groupby(axes, dropna=False)["run_dir"].nunique()
    if (runs_per_cell > 1).any():
        cell = runs_per_cell[runs_per_cell > 1].index[0]
        where = ", ".join(f"{axis}={format_value(value)}" for axis, value in zip(axes, _as_tuple(cell)))
        raise ResultsError(f"pivot cell {where} holds {runs_per_cell[cell]} runs; "
                           "add the axis that tells them apart to rows or cols, or filter the runs first")


def _as_tuple(cell) -> tuple:
    return cell if isinstance(cell, tuple) else (cell,)


def to_markdown(frame: pd.DataFrame, index: bool = True) -> str:
    """A GitHub markdown table (named index levels become leading columns); numbers to 3 significant figures."""
    if index and any(name is not None for name in frame.index.names):
        frame = frame.reset_index()
    body = [[format_cell(value) for value in row] for row in frame.itertuples(index=False)]
    return markdown_table([str(column) for column in frame.columns], body) + "\n"


def format_cell(value) -> str:
    """Floats to 3 significant figures (thousands without exponent), NaN and None as empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)
