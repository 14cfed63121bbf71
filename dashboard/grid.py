"""Sortable tables (dash-ag-grid, the replacement Dash recommends for ``dash_table``): numbers
stay numbers (they sort as such) and are shown with an SI prefix and their unit by the grid's
own d3 formatting; links as markdown cells. Colours follow Mantine's theme (``gpuwatt.css``)."""

from __future__ import annotations

from typing import Any

import dash_ag_grid as dag

#: Rows per page (sorting is over every row).
PAGE_ROWS = 25


def _fmt(expr: str) -> dict[str, str]:
    return {"function": f"params.value == null ? '' : {expr}"}


def si_column(field: str, name: str, unit: str) -> dict[str, Any]:
    """A number in base units shown as "3.21 kWh", "549 PFLOPS"."""
    return {
        "field": field,
        "headerName": name,
        "type": "numericColumn",
        "valueFormatter": _fmt(f"d3.format('.3~s')(params.value) + '{unit}'"),
    }


def number_column(field: str, name: str, specifier: str = ".3~r") -> dict[str, Any]:
    return {
        "field": field,
        "headerName": name,
        "type": "numericColumn",
        "valueFormatter": _fmt(f"d3.format('{specifier}')(params.value)"),
    }


def text_column(field: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"field": field, "headerName": name, **extra}


def link_column(field: str, name: str) -> dict[str, Any]:
    """Cells holding ``[text](href)``: a link in the same tab."""
    return {"field": field, "headerName": name, "cellRenderer": "markdown", "linkTarget": "_self"}


def md_link(text: str, href: str) -> str:
    safe = text.replace("[", "\\[").replace("]", "\\]")
    return f"[{safe}]({href.replace(' ', '%20').replace(')', '%29')})"


def sortable_table(columns: list[dict[str, Any]], rows: list[dict[str, Any]], id_: str) -> Any:
    return dag.AgGrid(
        id=id_,
        columnDefs=columns,
        rowData=rows,
        defaultColDef={"sortable": True, "resizable": True, "suppressMovable": True},
        columnSize="autoSize",
        dashGridOptions={
            "domLayout": "autoHeight",
            "pagination": len(rows) > PAGE_ROWS,
            "paginationPageSize": PAGE_ROWS,
            "paginationPageSizeSelector": False,
            "suppressCellFocus": True,
            "animateRows": False,
        },
        className="gw-grid",
        style={"width": "100%"},
    )
