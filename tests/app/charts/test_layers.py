"""Per-layer charts (app.charts.layers)."""

import pytest

from app.charts import layers as charts


def test_layer_curves_and_bars():
    rows = [{"layer": layer, "step": step, "value": 1.0 / (step + layer)} for layer in (0, 1) for step in (2, 4)]
    fig = charts.layer_curves(rows)
    assert [t.name for t in fig.data] == ["layer 0", "layer 1"] and list(fig.data[1].y) == [1 / 3, 1 / 5]
    bars = charts.layer_bars({"#1": [0.5, 0.0, 0.25]}, {"#1": [1]})
    assert list(bars.data[0].y) == [0.5, None, 0.25] and list(bars.data[0].text) == ["", "softmax", ""]
    nulls = charts.layer_bars({"#1": [0.5, None, 0.0, 0.25]}, {"#1": [1, 2]})
    assert list(nulls.data[0].y) == [0.5, None, None, 0.25]


def test_layer_step_heatmap_labels_every_layer_and_leaves_missing_cells_blank():
    rows = [{"layer": layer, "step": step, "value": 10.0 ** -(layer + step)} for layer in range(40) for step in (1, 3)]
    rows[1]["value"] = 0.0  # layer 0, step 3: no log
    fig = charts.layer_step_heatmap(rows[:-1], title="t")  # layer 39 has no step 3
    (heat,) = fig.data
    assert list(heat.y) == list(fig.layout.yaxis.tickvals) == [f"layer {i}" for i in range(40)]
    assert list(heat.x) == [1, 3] and list(heat.z[0]) == [-1.0, None] and list(heat.z[39]) == [-40.0, None]
    assert list(heat.z[5]) == pytest.approx([-6.0, -8.0]) and heat.customdata[5][0] == pytest.approx(1e-6)


def test_final_layer_mse_draws_points_on_a_log_axis_and_bars_on_a_linear_one():
    log = charts.final_layer_mse({"#1": [0.5, None, 0.25]}, {"#1": [1]})
    assert log.data[0].type == "scatter" and log.layout.yaxis.type == "log"
    assert list(log.data[0].y) == [0.5, None, 0.25] and list(log.data[0].text) == ["", "softmax", ""]
    linear = charts.final_layer_mse({"#1": [0.5, None, 0.25]}, {"#1": [1]}, log_y=False)
    assert linear.data[0].type == "bar" and linear.layout.yaxis.type != "log"


def test_chosen_layer_curves_pair_training_and_validation_in_one_colour_per_layer():
    train = [{"layer": layer, "step": step, "value": 1.0 / step} for layer in (2, 5) for step in (1, 2, 3)]
    val = [{"layer": 5, "step": 2, "value": 0.75}]
    fig = charts.chosen_layer_curves(train, val, [2, 5])
    assert [t.name for t in fig.data] == ["layer 2 (training)", "layer 5 (training)", "layer 5 (validation)"]
    assert fig.data[1].line.color == fig.data[2].line.color != fig.data[0].line.color
    assert list(fig.data[2].y) == [0.75] and fig.layout.yaxis.type == "log"


def test_layer_score_bars_mark_the_kept_layers_and_skip_null_scores():
    fig = charts.layer_score_bars([0.125, None, 0.5, 0.03125], [2], "kl")
    (bars,) = fig.data
    assert list(bars.x) == [0, 2, 3] and list(bars.y) == [0.125, 0.5, 0.03125]
    assert list(bars.text) == ["", "kept softmax", ""]
    converted, kept = charts.SCORE_COLORS["converted"], charts.SCORE_COLORS["kept"]
    assert converted != kept and list(bars.marker.color) == [converted, kept, converted]
    assert "next-token KL" in fig.layout.title.text and fig.layout.yaxis.type == "log"
    linear = charts.layer_score_bars([0.25, 0.5], [], "mse", log_y=False)
    assert linear.layout.yaxis.type != "log" and "normalised attention-output MSE" in linear.layout.yaxis.title.text
    assert list(linear.data[0].text) == ["", ""]


def test_log_axes_tick_powers_of_ten_and_layer_axes_start_at_layer_0():
    rows = [{"layer": 0, "step": 1, "value": 1e-6}, {"layer": 1, "step": 1, "value": 1e-3}]
    figures = [charts.layer_curves(rows), charts.final_layer_mse({"#1": [1e-6, 1e-3, 0.5]}),
               charts.layer_bars({"#1": [1e-6, 1e-3]}), charts.layer_score_bars([1e-6, 1e-3], [], "kl"),
               charts.chosen_layer_curves(rows, [], [0, 1]), charts.stage_curves({"mse": [(1, 1e-6)]}, title="t",
                                                                               y_title="MSE", log_y=True)]
    for fig in figures:
        assert (fig.layout.yaxis.type, fig.layout.yaxis.exponentformat, fig.layout.yaxis.minexponent) == \
            ("log", "power", 0)
    assert list(charts.final_layer_mse({"#1": [1e-6, 1e-3, 0.5]}).layout.xaxis.range) == [-0.5, 2.5]
    assert list(charts.layer_bars({"#1": [1e-6, 1e-3]}).layout.xaxis.range) == [-0.5, 1.5]
    assert list(charts.layer_score_bars([1e-6, 1e-3], [], "kl").layout.xaxis.range) == [-0.5, 1.5]
