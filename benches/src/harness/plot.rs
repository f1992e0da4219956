//! The comparison plot: one SVG with a bar chart per headline figure, the
//! paths side by side (and each proxy where the figure is per proxy), so a
//! reader sees at a glance what the tunnel costs against direct. Same-node
//! CPU bars are its one proxy's, beside the two of the other paths.

use std::path::Path;

use plotters::prelude::*;

use crate::harness::figures::Figures;

/// Plot size in pixels: four panels in a 2×2 grid.
const SIZE: (u32, u32) = (1200, 800);

/// One panel: a title and labelled bars.
struct Panel {
    title: &'static str,
    bars: Vec<(String, f64)>,
}

/// Writes the plot of `figures` (build A's medians) to `path`.
pub fn write(figures: &Figures, path: &Path) -> anyhow::Result<()> {
    let panels = panels(figures);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&panels) {
        draw(area, panel)?;
    }
    root.present()?;
    Ok(())
}

fn panels(figures: &Figures) -> Vec<Panel> {
    let bars = |names: &[(&str, &str)]| -> Vec<(String, f64)> {
        names
            .iter()
            .filter_map(|(label, name)| {
                figures
                    .get(*name)
                    .map(|value| ((*label).to_owned(), *value))
            })
            .collect()
    };
    vec![
        Panel {
            title: "one stream, Gbit/s (higher is better)",
            bars: bars(&[
                ("direct", "direct.stream1.gbit_per_s"),
                ("tcp", "tcp.stream1.gbit_per_s"),
                ("hbone", "hbone.stream1.gbit_per_s"),
                ("hbone ×8", "hbone.stream8.gbit_per_s"),
                ("same-node", "same-node.stream1.gbit_per_s"),
            ]),
        },
        Panel {
            title: "1 KiB request/response p50, µs (lower is better)",
            bars: bars(&[
                ("direct", "direct.rr.p50_us"),
                ("tcp", "tcp.rr.p50_us"),
                ("hbone", "hbone.rr.p50_us"),
                ("same-node", "same-node.rr.p50_us"),
            ]),
        },
        Panel {
            title: "CPU s per GB, per proxy (lower is better)",
            bars: bars(&[
                ("tcp client", "tcp.stream1.client.cpu_s_per_gb"),
                ("tcp server", "tcp.stream1.server.cpu_s_per_gb"),
                ("hbone client", "hbone.stream1.client.cpu_s_per_gb"),
                ("hbone server", "hbone.stream1.server.cpu_s_per_gb"),
                ("same-node", "same-node.stream1.both.cpu_s_per_gb"),
            ]),
        },
        Panel {
            title: "CPU µs per request / per new connection (lower is better)",
            bars: bars(&[
                ("rr client", "hbone.rr.client.cpu_us_per_request"),
                ("rr server", "hbone.rr.server.cpu_us_per_request"),
                ("conn client", "hbone.connect.client.cpu_us_per_connection"),
                ("conn server", "hbone.connect.server.cpu_us_per_connection"),
                ("rr same-node", "same-node.rr.both.cpu_us_per_request"),
                (
                    "conn same-node",
                    "same-node.connect.both.cpu_us_per_connection",
                ),
            ]),
        },
    ]
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let top = panel
        .bars
        .iter()
        .map(|(_, value)| *value)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE)
        * 1.15;
    let count = panel.bars.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d((0..count).into_segmented(), 0.0..top)?;
    let labels: Vec<String> = panel.bars.iter().map(|(label, _)| label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(index) => labels.get(*index).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(panel.bars.iter().enumerate().map(|(index, (_, value))| {
        let color = Palette99::pick(index).filled();
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(index), 0.0),
                (SegmentValue::Exact(index + 1), *value),
            ],
            color,
        );
        bar.set_margin(0, 0, 12, 12);
        bar
    }))?;
    chart.draw_series(panel.bars.iter().enumerate().map(|(index, (_, value))| {
        Text::new(
            format!("{value:.2}"),
            (SegmentValue::CenterOf(index), *value),
            ("sans-serif", 13),
        )
    }))?;
    Ok(())
}
