//! Charts (SVG) drawn from the JSON the benchmarks write, so that a saved JSON can be drawn again
//! (`ironguard-bench plot KIND --json IN --svg OUT`).
//!
//! Only plotters' SVG backend is used, without any of its font features: text goes into the SVG as `<text>`
//! elements (font family `sans-serif`) and the viewer picks the font, so nothing here needs fontconfig, freetype
//! or a font file. Where the layout needs a text's width (the legend's spacing), it is estimated from the number
//! of characters.

use anyhow::{Context as _, bail, ensure};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

/// Which benchmark's JSON a chart is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Full-load time against set size: ironguard, `nft -f`, iptables per MAC.
    Dataplane,
    /// UpdatePxeFilters → kernel latency, p50 and p99, for 1 and 3 agents.
    Filters,
    /// CDF of the callback reply latency and of callback → finished.
    Callbacks,
    /// Failover gaps per fault: every round, p50, p99 and max.
    Ha,
    /// Boot storms: the share of clients leased against the time it took, per scenario and size.
    Storm,
    /// The etcd work queue: cost per operation against the queue's length, ironguard and the previous algorithm.
    Queue,
    /// CDFs of boot → lease and inspect → finished per scenario of Ironic's inspections through the HA site.
    Site,
}

/// The chart of `kind` drawn from `json`, as an SVG document.
pub fn svg(kind: Kind, json: &Value) -> anyhow::Result<String> {
    match kind {
        Kind::Dataplane => dataplane_svg(json),
        Kind::Filters => filters_svg(json),
        Kind::Callbacks => callbacks_svg(json),
        Kind::Ha => ha_svg(json),
        Kind::Storm => storm_svg(json),
        Kind::Queue => queue_svg(json),
        Kind::Site => site_svg(json),
    }
}

// Colours (the usual categorical palette): each series has its own, so a chart reads in colour and the tests can
// find a series by it.
pub(crate) const BLUE_: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub(crate) const ORANGE_: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
pub(crate) const GREEN_: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
pub(crate) const RED_: RGBColor = RGBColor(0xd6, 0x27, 0x28);
// Their lighter shades (the same palette's light half), for a second curve of the same series.
pub(crate) const LIGHT_BLUE: RGBColor = RGBColor(0xae, 0xc7, 0xe8);
pub(crate) const LIGHT_ORANGE: RGBColor = RGBColor(0xff, 0xbb, 0x78);
pub(crate) const LIGHT_GREEN: RGBColor = RGBColor(0x98, 0xdf, 0x8a);
pub(crate) const LIGHT_RED: RGBColor = RGBColor(0xff, 0x98, 0x96);
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const MESH_BOLD: RGBColor = RGBColor(0xcc, 0xcc, 0xcc);
const MESH_LIGHT: RGBColor = RGBColor(0xee, 0xee, 0xee);

pub(crate) const IRONGUARD: RGBColor = BLUE_;
pub(crate) const NFT_F: RGBColor = ORANGE_;
pub(crate) const IPTABLES: RGBColor = RED_;
pub(crate) const REPLY: RGBColor = BLUE_;
pub(crate) const TO_FINISHED: RGBColor = GREEN_;
pub(crate) const ROUND: RGBColor = BLUE_;
pub(crate) const P50: RGBColor = GREEN_;
pub(crate) const P99: RGBColor = ORANGE_;
pub(crate) const MAX: RGBColor = RED_;
pub(crate) const BAR_P50: RGBColor = BLUE_;
pub(crate) const BAR_P99: RGBColor = ORANGE_;

const FONT: &str = "sans-serif";

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

// ---------------------------------------------------------------------------------------------------------------
// Reading the JSON.

/// `v[key]` as a number; `at` says where `v` is, for the error.
fn num(v: &Value, at: &str, key: &str) -> anyhow::Result<f64> {
    match v.get(key) {
        Some(x) => x.as_f64().with_context(|| format!("{at}: `{key}` is not a number: {x}")),
        None => bail!("{at}: no `{key}`"),
    }
}

/// `v[key]` as a number, or `None` when it is `null` (a figure that does not exist, e.g. a node that never
/// finished); a missing key is an error.
fn opt_num(v: &Value, at: &str, key: &str) -> anyhow::Result<Option<f64>> {
    match v.get(key) {
        Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).with_context(|| format!("{at}: `{key}` is not a number: {x}")),
        None => bail!("{at}: no `{key}`"),
    }
}

/// `v[key]` as a number > 0 (drawn on a log scale).
fn positive(v: &Value, at: &str, key: &str) -> anyhow::Result<f64> {
    let x = num(v, at, key)?;
    ensure!(x > 0.0 && x.is_finite(), "{at}: `{key}` is {x}, not > 0 (it is drawn on a log scale)");
    Ok(x)
}

/// `v[key]` as an array.
fn array<'a>(v: &'a Value, at: &str, key: &str) -> anyhow::Result<&'a Vec<Value>> {
    match v.get(key) {
        Some(x) => x.as_array().with_context(|| format!("{at}: `{key}` is not an array")),
        None => bail!("{at}: no `{key}`"),
    }
}

/// `v[key]` as an object.
fn object<'a>(v: &'a Value, at: &str, key: &str) -> anyhow::Result<&'a Value> {
    match v.get(key) {
        Some(x) if x.is_object() => Ok(x),
        Some(_) => bail!("{at}: `{key}` is not an object"),
        None => bail!("{at}: no `{key}`"),
    }
}

/// `v[key]` as text, or "" (context only).
fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

// ---------------------------------------------------------------------------------------------------------------
// Formatting.

/// Milliseconds for a label: µs under 1 ms, ms under 10 s, s above.
fn fmt_ms(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} µs", v * 1e3)
    } else if v < 10.0 {
        format!("{v:.2} ms")
    } else if v < 10_000.0 {
        format!("{v:.1} ms")
    } else {
        format!("{:.1} s", v / 1e3)
    }
}

/// A tick of a log milliseconds axis (1-2-5 ticks): as few decimals as the value needs.
fn tick(v: f64) -> String {
    if v <= 0.0 {
        "0".to_string()
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-v.log10().floor()).clamp(0.0, 9.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// A tick of a linear axis: up to 3 decimals, without trailing zeros.
fn tick_linear(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A tick of a count axis: 1k, 20k, 1M.
fn tick_count(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// Ticks 1, 2, 5 × 10ᵏ from `lo` to `hi` (only the powers of ten when that spans more than 4 decades), and the
/// light grid lines 1..9 × 10ᵏ.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let multipliers: &[f64] = if hi / lo > 1e4 { &[1.0] } else { &[1.0, 2.0, 5.0] };
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    let mut e = lo.log10().floor() as i32;
    while 10f64.powi(e) <= hi {
        let decade = 10f64.powi(e);
        for m in 1..=9 {
            let v = f64::from(m) * decade;
            if (lo..=hi).contains(&v) {
                if multipliers.contains(&f64::from(m)) {
                    bold.push(v);
                } else {
                    light.push(v);
                }
            }
        }
        e += 1;
    }
    (bold, light)
}

/// A log range around the values with room at both ends (at least a factor 2.5, so that it holds a 1-2-5 tick).
fn log_range(values: impl IntoIterator<Item = f64>, pad_low: f64, pad_high: f64) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.into_iter().filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.1, 10.0);
    }
    (lo / pad_low, hi * pad_high)
}

fn small(color: RGBColor) -> TextStyle<'static> {
    (FONT, 13).into_font().color(&color)
}

// ---------------------------------------------------------------------------------------------------------------
// Drawing helpers.

/// Renders into a string: `draw` gets the whole (white) canvas.
fn render(size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> anyhow::Result<()>) -> anyhow::Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        root.fill(&WHITE).map_err(plotting)?;
        draw(&root)?;
        root.present().map_err(plotting)?;
    }
    Ok(buf)
}

/// A plotters error (the SVG backend writes to a string, so in practice a layout error), with what failed.
fn plotting(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

/// The title and subtitle at the top, the notes (one a line) at the bottom; returns the area left for the chart.
fn frame<'a>(root: &Area<'a>, title: &str, subtitle: &str, notes: &[String]) -> anyhow::Result<Area<'a>> {
    let (w, h) = root.dim_in_pixel();
    let (w, h) = (w as i32, h as i32);
    let centre_top = Pos::new(HPos::Center, VPos::Top);
    root.draw(&Text::new(title, (w / 2, 10), (FONT, 24, FontStyle::Bold).into_font().color(&BLACK).pos(centre_top)))
        .map_err(plotting)?;
    let mut top = 42;
    if !subtitle.is_empty() {
        root.draw(&Text::new(subtitle, (w / 2, top), (FONT, 16).into_font().color(&GREY).pos(centre_top)))
            .map_err(plotting)?;
        top += 24;
    }
    let line = 18;
    let bottom = notes.len() as i32 * line + 10;
    for (i, note) in notes.iter().enumerate() {
        let y = h - bottom + 4 + i as i32 * line;
        root.draw(&Text::new(
            note.as_str(),
            (16, y),
            (FONT, 14).into_font().color(&GREY).pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(plotting)?;
    }
    Ok(root.margin(top + 6, bottom + 4, 10, 28))
}

/// A legend entry's sample of its series.
#[derive(Debug, Clone, Copy)]
enum Swatch {
    /// A dot of this radius and style.
    Dot(u32, ShapeStyle),
    /// A line with a dot on it.
    LineDot(RGBColor),
    /// A dashed line.
    Dashed(RGBColor),
    /// A short vertical stroke.
    Tick(ShapeStyle),
    /// A filled box.
    Bar(RGBColor),
}

/// Draws a legend across the top of `area`, entries left to right from `left`, wrapping onto more rows when they
/// do not fit; returns the area below it. Above the chart, a legend hides no data whatever the data are.
fn legend_above<'a>(area: &Area<'a>, left: i32, entries: &[(Swatch, String)]) -> anyhow::Result<Area<'a>> {
    const ROW: i32 = 24;
    let width = area.dim_in_pixel().0 as i32;
    // Text width from the character count: about 7 px a character at this size.
    let (mut x, mut y) = (left, ROW / 2);
    let mut placed = Vec::with_capacity(entries.len());
    for (_, label) in entries {
        let w = 28 + 7 * label.chars().count() as i32;
        if x + w > width && x > left {
            x = left;
            y += ROW;
        }
        placed.push((x, y));
        x += w + 28;
    }
    let (top, rest) = area.split_vertically(y + ROW / 2 + 8);
    let text = (FONT, 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for ((swatch, label), &(x, y)) in entries.iter().zip(&placed) {
        match *swatch {
            Swatch::Dot(r, style) => top.draw(&Circle::new((x + 10, y), r, style)),
            Swatch::LineDot(c) => top
                .draw(&PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)))
                .and_then(|_| top.draw(&Circle::new((x + 10, y), 4, c.filled()))),
            Swatch::Dashed(c) => top
                .draw(&PathElement::new(vec![(x, y), (x + 7, y)], c.stroke_width(2)))
                .and_then(|_| top.draw(&PathElement::new(vec![(x + 13, y), (x + 20, y)], c.stroke_width(2)))),
            Swatch::Tick(style) => top.draw(&PathElement::new(vec![(x + 10, y - 8), (x + 10, y + 8)], style)),
            Swatch::Bar(c) => top.draw(&Rectangle::new([(x + 1, y - 6), (x + 19, y + 6)], c.filled())),
        }
        .map_err(plotting)?;
        top.draw(&Text::new(label.as_str(), (x + 28, y), text.clone())).map_err(plotting)?;
    }
    Ok(rest)
}

/// A linear axis with ticks (and grid lines) only at the given values.
struct FixedTicks {
    ticks: Vec<f64>,
    linear: RangedCoordf64,
}

impl FixedTicks {
    fn new(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Self {
        Self { ticks, linear: range.into() }
    }

    /// `count` categories at 0, 1, …, count − 1.
    fn categories(count: usize) -> Self {
        Self::new(-0.6..count as f64 - 0.4, (0..count).map(|i| i as f64).collect())
    }
}

impl Ranged for FixedTicks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.linear.range()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// dataplane

struct Load {
    macs: f64,
    ironguard_ms: f64,
    nft_f_ms: f64,
}

/// Full-load time (ms, log) against set size (MACs, log): ironguard and `nft -f` as measured, iptables with one
/// process per MAC as measured (on fewer MACs), and that per-MAC cost × MACs as a dashed, labelled extrapolation.
pub fn dataplane_svg(json: &Value) -> anyhow::Result<String> {
    let at = "dataplane JSON";
    let loads = array(json, at, "full_load")?;
    ensure!(!loads.is_empty(), "{at}: `full_load` is empty");
    let mut pts = Vec::with_capacity(loads.len());
    let mut reps = Vec::new();
    for (i, l) in loads.iter().enumerate() {
        let at = format!("{at}: full_load[{i}]");
        pts.push(Load {
            macs: positive(l, &at, "macs")?,
            ironguard_ms: positive(l, &at, "ironguard_ms")?,
            nft_f_ms: positive(l, &at, "nft_f_ms")?,
        });
        if let Some(r) = l.get("reps").and_then(Value::as_u64) {
            reps.push(r);
        }
    }
    pts.sort_by(|a, b| a.macs.total_cmp(&b.macs));
    let ipt_at = format!("{at}: iptables_per_mac");
    let ipt = object(json, at, "iptables_per_mac")?;
    let ipt_macs = positive(ipt, &ipt_at, "macs")?;
    let ipt_total = positive(ipt, &ipt_at, "total_ms")?;
    let ipt_per_mac = positive(ipt, &ipt_at, "per_mac_ms")?;
    let ipt_last = ipt.get("per_mac_last_100_ms").and_then(Value::as_f64);
    // The extrapolation's value at each full-load size, and its line from the measured point to the largest size.
    let extrapolated: Vec<(f64, f64)> = pts.iter().map(|p| (p.macs, ipt_per_mac * p.macs)).collect();
    let mut dashed: Vec<f64> = pts.iter().map(|p| p.macs).chain([ipt_macs]).collect();
    dashed.sort_by(f64::total_cmp);
    dashed.dedup();
    let dashed: Vec<(f64, f64)> = dashed.into_iter().map(|x| (x, ipt_per_mac * x)).collect();

    let (x_lo, x_hi) = log_range(pts.iter().map(|p| p.macs).chain([ipt_macs]), 1.6, 1.6);
    let (y_lo, y_hi) = log_range(
        pts.iter()
            .flat_map(|p| [p.ironguard_ms, p.nft_f_ms])
            .chain([ipt_total])
            .chain(extrapolated.iter().map(|e| e.1)),
        2.0,
        3.0,
    );
    let (x_bold, x_light) = log_ticks(x_lo, x_hi);
    let (y_bold, y_light) = log_ticks(y_lo, y_hi);

    let reps_text = match (reps.iter().min(), reps.iter().max()) {
        (Some(1), Some(1)) => "one load per size".to_string(),
        (Some(a), Some(b)) if a == b => format!("median of {a} loads per size"),
        (Some(a), Some(b)) => format!("median of {a}–{b} loads per size"),
        _ => "median per size".to_string(),
    };
    let context: Vec<&str> =
        [text(json, "kernel"), text(json, "nft_version")].into_iter().filter(|s| !s.is_empty()).collect();
    let subtitle = if context.is_empty() {
        "same content in both: every set holds the same elements".to_string()
    } else {
        format!("kernel {}; same content in both", context.join(", "))
    };
    let mut notes = vec![
        format!(
            "ironguard: one netlink batch, in-process; nft -f: the same ruleset as a script (process start and parsing included); {reps_text}."
        ),
        format!(
            "iptables: one process per MAC (ironic-inspector's way), measured on {} MACs: {} in all, {} per MAC{}{}.",
            ipt_macs,
            fmt_ms(ipt_total),
            fmt_ms(ipt_per_mac),
            // Over 100 MACs or fewer, the last 100 are all of them.
            ipt_last
                .filter(|_| ipt_macs > 100.0)
                .map(|v| format!(" (last 100: {} per MAC)", fmt_ms(v)))
                .unwrap_or_default(),
            match text(ipt, "version") {
                "" => String::new(),
                v => format!("; {v}"),
            }
        ),
        "Dashed: that measured per-MAC cost × MACs, an extrapolation (not measured); hollow markers: its value at each size."
            .to_string(),
    ];
    if ipt_macs > 100.0 && ipt_last.is_some_and(|l| l > ipt_per_mac * 1.1) {
        notes.push("The per-MAC cost grew during the iptables run, so the extrapolation likely underestimates.".into());
    }

    let legend = [
        (Swatch::LineDot(IRONGUARD), "ironguard (netlink batch, in-process)".to_string()),
        (Swatch::LineDot(NFT_F), "nft -f (same content)".to_string()),
        (Swatch::Dot(5, IPTABLES.filled()), format!("iptables, one process per MAC (measured, {ipt_macs} MACs)")),
        (
            Swatch::Dashed(IPTABLES),
            format!("iptables, extrapolated: {} per MAC × MACs (not measured)", fmt_ms(ipt_per_mac)),
        ),
    ];

    render((1100, 760), |root| {
        let area = frame(root, "Full load: ironguard vs nft -f vs iptables per MAC", &subtitle, &notes)?;
        let area = legend_above(&area, 80, &legend)?;
        let mut chart = ChartBuilder::on(&area)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(x_bold).with_light_points(x_light),
                (y_lo..y_hi).log_scale().with_key_points(y_bold).with_light_points(y_light),
            )
            .map_err(plotting)?;
        chart
            .configure_mesh()
            .x_desc("set size: MACs in the deny set (log scale)")
            .y_desc("full-load time (ms, log scale)")
            .x_label_formatter(&|v| tick_count(*v))
            .y_label_formatter(&|v| tick(*v))
            .bold_line_style(MESH_BOLD)
            .light_line_style(MESH_LIGHT)
            .axis_desc_style((FONT, 17))
            .label_style((FONT, 15))
            .draw()
            .map_err(plotting)?;

        // The extrapolation first, under the measurements.
        chart
            .draw_series(DashedLineSeries::new(dashed.iter().copied(), 10, 6, IPTABLES.stroke_width(2)))
            .map_err(plotting)?;
        chart
            .draw_series(extrapolated.iter().map(|&(x, y)| {
                EmptyElement::at((x, y))
                    + Circle::new((0, 0), 5, IPTABLES.stroke_width(2))
                    + Text::new(
                        format!("≈ {}", fmt_ms(y)),
                        (-8, -8),
                        small(IPTABLES).pos(Pos::new(HPos::Right, VPos::Bottom)),
                    )
            }))
            .map_err(plotting)?;

        for (color, get, below) in
            [(IRONGUARD, (|p: &Load| p.ironguard_ms) as fn(&Load) -> f64, true), (NFT_F, |p: &Load| p.nft_f_ms, false)]
        {
            let series: Vec<(f64, f64)> = pts.iter().map(|p| (p.macs, get(p))).collect();
            chart.draw_series(LineSeries::new(series.iter().copied(), color.stroke_width(2))).map_err(plotting)?;
            chart
                .draw_series(series.iter().map(|&(x, y)| {
                    let (dy, v) = if below { (8, VPos::Top) } else { (-8, VPos::Bottom) };
                    EmptyElement::at((x, y))
                        + Circle::new((0, 0), 4, color.filled())
                        + Text::new(fmt_ms(y), (8, dy), small(color).pos(Pos::new(HPos::Left, v)))
                }))
                .map_err(plotting)?;
        }

        chart
            .draw_series(std::iter::once(
                EmptyElement::at((ipt_macs, ipt_total))
                    + Circle::new((0, 0), 5, IPTABLES.filled())
                    + Text::new(fmt_ms(ipt_total), (8, -8), small(IPTABLES).pos(Pos::new(HPos::Left, VPos::Bottom))),
            ))
            .map_err(plotting)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// ha

struct FaultRow {
    name: String,
    p50: f64,
    p99: f64,
    max: f64,
    rounds: Option<u64>,
    /// Every round's gap, when the JSON has them (`gaps_ms`).
    gaps: Option<Vec<f64>>,
}

/// Failover gaps per fault, one row each (in the benchmark's order): every round's gap as a dot, p50, p99 and max
/// as ticks; gap in ms on a log scale, a gap of 0 (service never stopped) drawn hollow at the left edge.
pub fn ha_svg(json: &Value) -> anyhow::Result<String> {
    let at = "ha JSON";
    let map = json.as_object().with_context(|| format!("{at}: not an object"))?;
    let mut rows = Vec::new();
    for (name, v) in map {
        // A fault is an object with gap figures; `guard_tamper_repair` and any other entry are not.
        if v.get("gap_p50_ms").is_none() {
            continue;
        }
        let at = format!("{at}: fault `{name}`");
        let gaps = match v.get("gaps_ms") {
            None => None,
            Some(g) => Some(
                g.as_array()
                    .with_context(|| format!("{at}: `gaps_ms` is not an array"))?
                    .iter()
                    .map(|x| x.as_f64().with_context(|| format!("{at}: `gaps_ms` holds {x}, not a number")))
                    .collect::<anyhow::Result<Vec<f64>>>()?,
            ),
        };
        rows.push(FaultRow {
            name: name.clone(),
            p50: num(v, &at, "gap_p50_ms")?,
            p99: num(v, &at, "gap_p99_ms")?,
            max: num(v, &at, "gap_max_ms")?,
            rounds: v.get("rounds").and_then(Value::as_u64),
            gaps,
        });
    }
    ensure!(!rows.is_empty(), "{at}: no fault in it (an entry with `gap_p50_ms`)");
    // The benchmark's order (its fault matrix), then any other name.
    let order: Vec<&str> = ironguard_netns_tests::faults::Fault::ALL.iter().map(|f| f.name()).collect();
    rows.sort_by_key(|r| (order.iter().position(|n| *n == r.name).unwrap_or(usize::MAX), r.name.clone()));

    let all: Vec<f64> =
        rows.iter().flat_map(|r| [r.p50, r.p99, r.max].into_iter().chain(r.gaps.iter().flatten().copied())).collect();
    let (x_lo, x_hi) = log_range(all.iter().copied(), 2.5, 2.0);
    let zeros = all.iter().filter(|v| **v <= 0.0).count();
    let (x_bold, x_light) = log_ticks(x_lo, x_hi);
    let n = rows.len();
    let y_of = |i: usize| (n - 1 - i) as f64;
    let names: Vec<String> = rows
        .iter()
        .map(|r| match r.rounds {
            Some(k) => format!("{} ({k})", r.name),
            None => r.name.clone(),
        })
        .collect();
    let label_of = |y: f64| -> String {
        let r = y.round();
        if (y - r).abs() > 0.01 || r < 0.0 || r >= n as f64 {
            return String::new();
        }
        names.get(n - 1 - r as usize).cloned().unwrap_or_default()
    };
    let total_gaps: usize = rows.iter().filter_map(|r| r.gaps.as_ref()).map(Vec::len).sum();
    let with_gaps = rows.iter().filter(|r| r.gaps.is_some()).count();
    let mut notes = vec![
        "gap = the longest time nobody served DHCP during a round (kernel watcher, every host every ~2 ms); (n) = rounds."
            .to_string(),
    ];
    if with_gaps < n {
        notes.push(format!(
            "{} of {n} faults have no per-round gaps in this JSON (`gaps_ms`): only their p50 / p99 / max are drawn.",
            n - with_gaps
        ));
    }
    if zeros > 0 {
        notes.push(
            "A gap of 0 (service never stopped) has no place on a log scale: it is drawn at the left edge (a round as a ring)."
                .into(),
        );
    }
    let height = 200 + 36 * n as u32 + 18 * notes.len() as u32;

    // p50 / p99 / max: vertical ticks, shorter for the higher percentiles so that equal ones stay visible.
    let ticks = [
        ("p50", P50, 0.40, 3, (|r: &FaultRow| r.p50) as fn(&FaultRow) -> f64),
        ("p99", P99, 0.30, 3, |r: &FaultRow| r.p99),
        ("max", MAX, 0.20, 2, |r: &FaultRow| r.max),
    ];
    let mut legend = Vec::new();
    if total_gaps > 0 {
        legend.push((Swatch::Dot(3, ROUND.mix(0.55).filled()), format!("each round ({total_gaps} in all)")));
    }
    if rows.iter().flat_map(|r| r.gaps.iter().flatten()).any(|g| *g <= 0.0) {
        legend.push((Swatch::Dot(3, ROUND.stroke_width(1)), "a round with no gap (0, at the left edge)".to_string()));
    }
    for (label, color, _, width, _) in ticks {
        legend.push((Swatch::Tick(color.stroke_width(width)), label.to_string()));
    }

    render((1340, height), |root| {
        let area = frame(root, "Failover gaps per fault", "3 PXE hosts, etcd, 2 control-plane replicas", &notes)?;
        // The legend on top, the chart, and a column on its right with each fault's figures.
        let rest = legend_above(&area, 260, &legend)?;
        let (plot_area, side) = rest.split_horizontally(rest.dim_in_pixel().0 as i32 - 300);
        let mut chart = ChartBuilder::on(&plot_area)
            .x_label_area_size(50)
            .y_label_area_size(250)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(x_bold).with_light_points(x_light),
                FixedTicks::categories(n),
            )
            .map_err(plotting)?;
        chart
            .configure_mesh()
            .x_desc("gap (ms, log scale)")
            .y_desc("fault (rounds)")
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| label_of(*v))
            .bold_line_style(MESH_BOLD)
            .light_line_style(MESH_LIGHT)
            .axis_desc_style((FONT, 17))
            .label_style((FONT, 15))
            .draw()
            .map_err(plotting)?;

        let at_edge = |v: f64| if v > 0.0 { v } else { x_lo };
        // Every round: a dot, spread a little up and down so that equal gaps stay visible; a gap of 0 as a ring.
        let dots: Vec<(f64, f64, bool)> = rows
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                r.gaps.iter().flatten().enumerate().map(move |(k, &g)| {
                    let jitter = ((k * 37) % 9) as f64 / 8.0 - 0.5;
                    (at_edge(g), y_of(i) + jitter * 0.4, g > 0.0)
                })
            })
            .collect();
        chart
            .draw_series(dots.iter().map(|&(x, y, filled)| {
                let style = if filled { ROUND.mix(0.55).filled() } else { ROUND.stroke_width(1) };
                Circle::new((x, y), 3, style)
            }))
            .map_err(plotting)?;
        for (_, color, half, width, get) in ticks {
            chart
                .draw_series(rows.iter().enumerate().map(|(i, r)| {
                    let x = at_edge(get(r));
                    PathElement::new(vec![(x, y_of(i) - half), (x, y_of(i) + half)], color.stroke_width(width))
                }))
                .map_err(plotting)?;
        }

        // Each fault's figures, level with its row.
        let (_, side_top) = side.get_base_pixel();
        for (i, r) in rows.iter().enumerate() {
            let (_, y) = chart.backend_coord(&(x_lo, y_of(i)));
            side.draw(&Text::new(
                format!("p50 {} · p99 {} · max {}", fmt_ms(r.p50), fmt_ms(r.p99), fmt_ms(r.max)),
                (12, y - side_top),
                small(GREY).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(plotting)?;
        }

        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// callbacks

struct Cdf {
    label: String,
    color: RGBColor,
    /// Sorted samples.
    samples: Vec<f64>,
    /// What the percentages are of (at least the samples; more when some have no value, e.g. a node that never
    /// finished: the curve then ends below 100 %).
    of: usize,
    /// (name, percentile in %, value) from the JSON's summary.
    marks: Vec<(&'static str, f64, f64)>,
}

impl Cdf {
    /// The curve's vertices: one per sample, at (value, share at or below in %), values below `x_lo` at `x_lo`.
    fn points(&self, x_lo: f64) -> Vec<(f64, f64)> {
        let of = self.of.max(self.samples.len()).max(1) as f64;
        self.samples.iter().enumerate().map(|(i, &v)| (v.max(x_lo), (i + 1) as f64 / of * 100.0)).collect()
    }
}

/// Draws `cdfs` on `area`: x the value in ms on a log scale over `x_range`, y the share at or below in %, each
/// curve with its marks (a dot, labelled "p50 12 ms" beside it when `labelled`).
fn draw_cdfs(
    area: &Area<'_>,
    cdfs: &[Cdf],
    (x_lo, x_hi): (f64, f64),
    (x_desc, y_desc): (&str, &str),
    labelled: bool,
) -> anyhow::Result<()> {
    let (x_bold, x_light) = log_ticks(x_lo, x_hi);
    let mut chart = ChartBuilder::on(area)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(x_bold).with_light_points(x_light),
            FixedTicks::new(0.0..102.0, vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 99.0, 100.0]),
        )
        .map_err(plotting)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| if *v == 99.0 { String::new() } else { format!("{v:.0}") })
        .bold_line_style(MESH_BOLD)
        .light_line_style(MESH_LIGHT)
        .axis_desc_style((FONT, 17))
        .label_style((FONT, 15))
        .draw()
        .map_err(plotting)?;
    for c in cdfs {
        chart.draw_series(LineSeries::new(c.points(x_lo), c.color.stroke_width(2))).map_err(plotting)?;
        if labelled {
            chart
                .draw_series(c.marks.iter().map(|&(name, pct, v)| {
                    // p99 and max sit 1 % apart: p99's label goes below right (under the curve's flat top), the
                    // others to the right.
                    let offset = if name == "p99" { (8, 14) } else { (8, -4) };
                    EmptyElement::at((v.max(x_lo), pct))
                        + Circle::new((0, 0), 4, c.color.filled())
                        + Text::new(
                            format!("{name} {}", fmt_ms(v)),
                            offset,
                            small(c.color).pos(Pos::new(HPos::Left, VPos::Center)),
                        )
                }))
                .map_err(plotting)?;
        } else {
            chart
                .draw_series(c.marks.iter().map(|&(_, pct, v)| Circle::new((v.max(x_lo), pct), 4, c.color.filled())))
                .map_err(plotting)?;
        }
    }
    Ok(())
}

/// Cumulative distributions (x: ms, log; y: % of callbacks) of the reply latency and of callback → `finished`,
/// one vertex per callback, with the JSON's p50 / p99 / max marked on each curve.
pub fn callbacks_svg(json: &Value) -> anyhow::Result<String> {
    let at = "callbacks JSON";
    let callbacks = array(json, at, "callbacks")?;
    ensure!(!callbacks.is_empty(), "{at}: `callbacks` is empty");
    let mut cdfs = Vec::new();
    for (key, label, color) in [
        ("reply_ms", "/v1/continue reply latency", REPLY),
        ("callback_to_finished_ms", "callback → inspection finished", TO_FINISHED),
    ] {
        let mut samples = callbacks
            .iter()
            .enumerate()
            .map(|(i, c)| num(c, &format!("{at}: callbacks[{i}]"), key))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        samples.sort_by(f64::total_cmp);
        let summary = object(json, at, key)?;
        let sat = format!("{at}: {key}");
        let marks = vec![
            ("p50", 50.0, num(summary, &sat, "p50")?),
            ("p99", 99.0, num(summary, &sat, "p99")?),
            ("max", 100.0, num(summary, &sat, "max")?),
        ];
        let of = samples.len();
        cdfs.push(Cdf { label: label.to_string(), color, samples, of, marks });
    }
    let (x_lo, x_hi) = log_range(cdfs.iter().flat_map(|c| c.samples.iter().copied()), 1.6, 2.5);
    let n = callbacks.len();
    let nodes = json.get("nodes").and_then(Value::as_u64).unwrap_or(n as u64);
    let mut context = vec![format!("{nodes} callbacks")];
    if let Some(c) = json.get("concurrency").and_then(Value::as_u64) {
        context.push(format!("{c} at once"));
    }
    if let Some(w) = json.get("workers").and_then(Value::as_u64) {
        context.push(format!("{w} inspection workers"));
    }
    if !text(json, "ironic_version").is_empty() {
        context.push(format!("real Ironic {}", text(json, "ironic_version")));
    }
    let notes = vec![
        "reply: from sending the callback until its whole reply is read (each callback from its own address and connection)."
            .to_string(),
        "callback → finished: the inspection's finished_at minus the callback's send time (same host clock).".to_string(),
    ];

    let legend: Vec<(Swatch, String)> = cdfs.iter().map(|c| (Swatch::LineDot(c.color), c.label.clone())).collect();

    render((1100, 720), |root| {
        let area = frame(root, "Ramdisk callbacks (/v1/continue): latency distribution", &context.join(", "), &notes)?;
        let area = legend_above(&area, 80, &legend)?;
        draw_cdfs(&area, &cdfs, (x_lo, x_hi), ("latency (ms, log scale)", "callbacks at or below (%)"), true)
    })
}

// ---------------------------------------------------------------------------------------------------------------
// filters

/// UpdatePxeFilters → MAC in the kernel set(s): p50 and p99 bars for 1 agent and for 3 agents.
pub fn filters_svg(json: &Value) -> anyhow::Result<String> {
    let at = "filters JSON";
    let mut groups = Vec::new();
    for (key, name) in [("latency_1_agent", "1 agent"), ("latency_3_agents", "3 agents (all of them)")] {
        let v = object(json, at, key)?;
        let gat = format!("{at}: {key}");
        let updates = v.get("updates").and_then(Value::as_u64);
        groups.push((name, num(v, &gat, "p50_ms")?, num(v, &gat, "p99_ms")?, updates));
    }
    let top = groups.iter().map(|g| g.1.max(g.2)).fold(0.0f64, f64::max).max(1e-3) * 1.25;
    let labels: Vec<String> = groups
        .iter()
        .map(|(name, _, _, updates)| match updates {
            Some(u) => format!("{name}, {u} updates"),
            None => name.to_string(),
        })
        .collect();
    let label_of = |x: f64| -> String {
        let r = x.round();
        if (x - r).abs() > 0.01 || r < 0.0 {
            return String::new();
        }
        labels.get(r as usize).cloned().unwrap_or_default()
    };
    let subtitle = match json.get("loaded").and_then(Value::as_u64) {
        Some(n) => format!("real control plane and agents, each agent in its own network namespace; {n} MACs loaded"),
        None => "real control plane and agents, each agent in its own network namespace".to_string(),
    };
    let notes = vec![
        "From just before the UpdatePxeFilters call until the MAC is in the kernel's allow set (of every agent)."
            .to_string(),
    ];
    let legend = [(Swatch::Bar(BAR_P50), "p50".to_string()), (Swatch::Bar(BAR_P99), "p99".to_string())];
    render((900, 640), |root| {
        let area = frame(root, "UpdatePxeFilters → MAC in the kernel set", &subtitle, &notes)?;
        let area = legend_above(&area, 80, &legend)?;
        let mut chart = ChartBuilder::on(&area)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(FixedTicks::categories(groups.len()), 0.0..top)
            .map_err(plotting)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("agents")
            .y_desc("latency (ms)")
            .x_label_formatter(&|v| label_of(*v))
            .y_label_formatter(&|v| tick_linear(*v))
            .bold_line_style(MESH_BOLD)
            .light_line_style(TRANSPARENT)
            .axis_desc_style((FONT, 17))
            .label_style((FONT, 15))
            .draw()
            .map_err(plotting)?;
        for (color, x0, x1, pick) in [(BAR_P50, -0.32, -0.02, 0usize), (BAR_P99, 0.02, 0.32, 1usize)] {
            chart
                .draw_series(groups.iter().enumerate().map(|(i, g)| {
                    let v = if pick == 0 { g.1 } else { g.2 };
                    let x = i as f64;
                    Rectangle::new([(x + x0, 0.0), (x + x1, v)], color.filled())
                }))
                .map_err(plotting)?;
            chart
                .draw_series(groups.iter().enumerate().map(|(i, g)| {
                    let v = if pick == 0 { g.1 } else { g.2 };
                    Text::new(
                        fmt_ms(v),
                        (i as f64 + (x0 + x1) / 2.0, v),
                        small(BLACK).pos(Pos::new(HPos::Center, VPos::Bottom)),
                    )
                }))
                .map_err(plotting)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// storm

/// A scenario's colour: dnsmasq alone as the baseline's orange, the site without a fault in ironguard's blue, the
/// faults in red and green.
fn storm_color(key: &str) -> RGBColor {
    match key {
        "alone" => NFT_F,
        "ironguard" => IRONGUARD,
        "sigkill" => RED_,
        _ => GREEN_,
    }
}

struct StormCurve {
    name: String,
    color: RGBColor,
    /// Sorted times to lease (ms) and the clients of all the scenario's storms: each lease is a step of
    /// 100 / clients %, so a curve ends at the share leased.
    samples: Vec<f64>,
    clients: f64,
}

/// Per storm size a panel: the share of clients leased (%) against the time to lease (ms, log), a curve per
/// scenario, with the 99.9 % goal as a line.
pub fn storm_svg(json: &Value) -> anyhow::Result<String> {
    let at = "storm JSON";
    let sizes = array(json, at, "sizes")?;
    ensure!(!sizes.is_empty(), "{at}: `sizes` is empty");
    let mut panels = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let sat = format!("{at}: sizes[{i}]");
        let n = num(size, &sat, "clients")?;
        let mut curves = Vec::new();
        for (k, sc) in array(size, &sat, "scenarios")?.iter().enumerate() {
            let cat = format!("{sat}: scenarios[{k}]");
            let mut samples = array(sc, &cat, "time_to_lease_ms")?
                .iter()
                .map(|x| x.as_f64().with_context(|| format!("{cat}: `time_to_lease_ms` holds {x}, not a number")))
                .collect::<anyhow::Result<Vec<f64>>>()?;
            samples.sort_by(f64::total_cmp);
            let clients = num(sc, &cat, "clients")?;
            ensure!(
                clients >= samples.len() as f64 && clients > 0.0,
                "{cat}: {clients} clients, {} leases",
                samples.len()
            );
            curves.push(StormCurve {
                name: text(sc, "name").to_string(),
                color: storm_color(text(sc, "key")),
                samples,
                clients,
            });
        }
        ensure!(!curves.is_empty(), "{sat}: no scenario");
        panels.push((n, curves));
    }
    let (x_lo, x_hi) =
        log_range(panels.iter().flat_map(|(_, c)| c.iter().flat_map(|c| c.samples.iter().copied())), 1.6, 2.5);
    let (x_bold, x_light) = log_ticks(x_lo, x_hi);
    let schedule = json
        .get("schedule_s")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(Value::as_f64).map(|v| format!("{v}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let subtitle = format!(
        "3 PXE hosts with ironguard, and one dnsmasq alone; DISCOVER timeouts {schedule} s; powering on over {} ms",
        json.get("spread_ms").and_then(Value::as_u64).unwrap_or(0)
    );
    let notes = vec![
        "time to lease: the client's first DISCOVER → its ACK; a curve ends at the share of clients leased within the schedule."
            .to_string(),
        "Faults are injected into the leader once half of the clients are bound.".to_string(),
    ];
    // One legend for all panels: every scenario once, in the order first seen.
    let mut legend: Vec<(Swatch, String)> = Vec::new();
    for (_, curves) in &panels {
        for c in curves {
            if !legend.iter().any(|(_, l)| *l == c.name) {
                legend.push((Swatch::LineDot(c.color), c.name.clone()));
            }
        }
    }
    let width = 200 + 560 * panels.len() as u32;
    render((width, 760), |root| {
        let area = frame(root, "Boot storm: clients leased against time to lease", &subtitle, &notes)?;
        let area = legend_above(&area, 80, &legend)?;
        let cells = area.split_evenly((1, panels.len()));
        for ((n, curves), cell) in panels.iter().zip(cells.iter()) {
            let mut chart = ChartBuilder::on(cell)
                .caption(format!("{n} clients"), (FONT, 18))
                .margin_right(16)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d(
                    (x_lo..x_hi).log_scale().with_key_points(x_bold.clone()).with_light_points(x_light.clone()),
                    FixedTicks::new(0.0..102.0, vec![0.0, 20.0, 40.0, 60.0, 80.0, 99.9]),
                )
                .map_err(plotting)?;
            chart
                .configure_mesh()
                .x_desc("time to lease (ms, log scale)")
                .y_desc("clients leased (%)")
                .x_label_formatter(&|v| tick(*v))
                .y_label_formatter(&|v| if *v > 99.0 { "99.9".to_string() } else { format!("{v:.0}") })
                .bold_line_style(MESH_BOLD)
                .light_line_style(MESH_LIGHT)
                .axis_desc_style((FONT, 17))
                .label_style((FONT, 15))
                .draw()
                .map_err(plotting)?;
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(x_lo, 99.9), (x_hi, 99.9)], GREY.stroke_width(1))))
                .map_err(plotting)?;
            for c in curves {
                let points: Vec<(f64, f64)> = c
                    .samples
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (v.max(x_lo), (i + 1) as f64 / c.clients * 100.0))
                    .collect();
                chart.draw_series(LineSeries::new(points.clone(), c.color.stroke_width(2))).map_err(plotting)?;
                if let Some(&(x, y)) = points.last() {
                    chart
                        .draw_series(std::iter::once(
                            EmptyElement::at((x, y))
                                + Circle::new((0, 0), 4, c.color.filled())
                                + Text::new(
                                    format!("{y:.1} %"),
                                    (6, 10),
                                    small(c.color).pos(Pos::new(HPos::Left, VPos::Center)),
                                ),
                        ))
                        .map_err(plotting)?;
                }
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// site

/// A site scenario's colours: its boot → lease curve, and its inspect → finished curve in a lighter shade.
fn site_colors(key: &str) -> (RGBColor, RGBColor) {
    match key {
        "none" => (BLUE_, LIGHT_BLUE),
        "conductor-restart" => (GREEN_, LIGHT_GREEN),
        "leader-host-dies" => (RED_, LIGHT_RED),
        _ => (ORANGE_, LIGHT_ORANGE),
    }
}

/// Per scenario of the site benchmark two cumulative distributions (x: ms from the node's `inspect` request, log;
/// y: % of the scenario's inspected nodes, all rounds): boot → lease in the scenario's colour, inspect → finished
/// in a lighter shade of it, one vertex per node, with the JSON's p50 / p99 / max marked on each curve (their
/// values in the legend). A node without a figure (never leased or finished) counts in the percentages, so its
/// curve ends below 100 %.
pub fn site_svg(json: &Value) -> anyhow::Result<String> {
    let at = "site JSON";
    let scenarios = array(json, at, "scenarios")?;
    ensure!(!scenarios.is_empty(), "{at}: `scenarios` is empty");
    let mut cdfs = Vec::new();
    let mut skipped = Vec::new();
    for (i, sc) in scenarios.iter().enumerate() {
        let sat = format!("{at}: scenarios[{i}]");
        let name = match text(sc, "fault") {
            "" => text(sc, "key"),
            n => n,
        };
        let rounds = array(sc, &sat, "rounds")?;
        if rounds.is_empty() {
            skipped.push(name.to_string());
            continue;
        }
        let summary = object(sc, &sat, "summary")?;
        let (dark, light) = site_colors(text(sc, "key"));
        for (key, what, color) in
            [("boot_to_lease_ms", "boot → lease", dark), ("inspect_to_finished_ms", "inspect → finished", light)]
        {
            let (mut samples, mut of) = (Vec::new(), 0);
            for (r, round) in rounds.iter().enumerate() {
                let rat = format!("{sat}: rounds[{r}]");
                for (k, node) in array(round, &rat, "nodes")?.iter().enumerate() {
                    of += 1;
                    samples.extend(opt_num(node, &format!("{rat}: nodes[{k}]"), key)?);
                }
            }
            samples.sort_by(f64::total_cmp);
            let fig = object(summary, &format!("{sat}: summary"), key)?;
            let fat = format!("{sat}: summary: {key}");
            let mut marks = Vec::new();
            for (mark, pct) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
                marks.extend(opt_num(fig, &fat, mark)?.map(|v| (mark, pct, v)));
            }
            let figures = marks.iter().map(|(m, _, v)| format!("{m} {}", fmt_ms(*v))).collect::<Vec<_>>().join(" · ");
            let label = match figures.as_str() {
                "" => format!("{name}: {what} (none)"),
                f => format!("{name}: {what} ({f})"),
            };
            cdfs.push(Cdf { label, color, samples, of, marks });
        }
    }
    ensure!(!cdfs.is_empty(), "{at}: no scenario has a round");
    let (x_lo, x_hi) =
        log_range(cdfs.iter().flat_map(|c| c.samples.iter().copied().chain(c.marks.iter().map(|m| m.2))), 1.6, 2.5);
    let mut context = Vec::new();
    if let Some(n) = json.get("inspected").and_then(Value::as_u64) {
        context.push(format!("{n} nodes inspected at once"));
    }
    if let Some(n) = json.get("others").and_then(Value::as_u64) {
        context.push(format!("{n} others"));
    }
    if let Some(n) = json.get("rounds").and_then(Value::as_u64) {
        context.push(format!("{n} round{} per scenario", if n == 1 { "" } else { "s" }));
    }
    if !text(json, "etcd").is_empty() {
        context.push(format!("etcd {}", text(json, "etcd")));
    }
    if !text(json, "ironic").is_empty() {
        context.push(format!("Ironic {}", text(json, "ironic")));
    }
    let mut notes = vec![
        "boot → lease (dark): from the node's `inspect` request accepted to its DHCP lease (udhcpc, run again until a lease)."
            .to_string(),
        "inspect → finished (light): from the same request to `manageable` again with its data processed (the callback included)."
            .to_string(),
        "y: share of the scenario's inspected nodes over all its rounds; a node that never leased or finished keeps its curve below 100 %."
            .to_string(),
    ];
    if !skipped.is_empty() {
        notes.push(format!("No round completed: {}.", skipped.join(", ")));
    }
    let legend: Vec<(Swatch, String)> = cdfs.iter().map(|c| (Swatch::LineDot(c.color), c.label.clone())).collect();

    render((1200, 880), |root| {
        let area = frame(
            root,
            "Ironic inspecting nodes through the HA site: time to lease and to finished",
            &context.join(", "),
            &notes,
        )?;
        let area = legend_above(&area, 80, &legend)?;
        draw_cdfs(
            &area,
            &cdfs,
            (x_lo, x_hi),
            ("time from the node's inspect request (ms, log scale)", "nodes at or below (%)"),
            false,
        )
    })
}

// ---------------------------------------------------------------------------------------------------------------
// queue

/// The work queue: median time per operation (log) against the queue's length (log), one line per operation and
/// algorithm: ironguard's solid, the previous algorithm's dashed, take in blue, pending in orange, enqueue in green.
pub fn queue_svg(json: &Value) -> anyhow::Result<String> {
    let at = "queue JSON";
    let rows = array(json, at, "rows")?;
    // (operation, previous algorithm, colour, points)
    type Line<'a> = (&'a str, bool, RGBColor, Vec<(f64, f64)>);
    let mut series: Vec<Line<'_>> = Vec::new();
    for (op, color) in [("take", BLUE_), ("pending", ORANGE_), ("enqueue", GREEN_)] {
        for old in [false, true] {
            let key = if old { "old_p50_ms" } else { "new_p50_ms" };
            let mut pts = Vec::new();
            for r in rows.iter().filter(|r| text(r, "op") == op) {
                pts.push((positive(r, at, "length")?, positive(r, at, key)?));
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push((op, old, color, pts));
        }
    }
    ensure!(series.iter().any(|s| !s.3.is_empty()), "{at}: no rows");
    let (x_lo, x_hi) = log_range(series.iter().flat_map(|s| s.3.iter().map(|p| p.0)), 0.7, 1.4);
    let (y_lo, y_hi) = log_range(series.iter().flat_map(|s| s.3.iter().map(|p| p.1)), 0.5, 2.0);
    let (x_bold, x_light) = log_ticks(x_lo, x_hi);
    let (y_bold, y_light) = log_ticks(y_lo, y_hi);
    let etcd = json.get("etcd").and_then(Value::as_str).unwrap_or("?");
    let subtitle = format!("3-member etcd {etcd} cluster on loopback; median of each operation");
    let notes = vec![
        "Dashed: the previous algorithm (whole queue read per take, one read per request for pending).".to_string(),
    ];
    let legend: Vec<(Swatch, String)> = vec![
        (Swatch::LineDot(BLUE_), "take".to_string()),
        (Swatch::LineDot(ORANGE_), "pending".to_string()),
        (Swatch::LineDot(GREEN_), "enqueue".to_string()),
        (Swatch::Dashed(GREY), "previous algorithm".to_string()),
    ];
    render((1000, 700), |root| {
        let area = frame(root, "etcd work queue: cost per operation against queue length", &subtitle, &notes)?;
        let area = legend_above(&area, 80, &legend)?;
        let mut chart = ChartBuilder::on(&area)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (x_lo..x_hi).log_scale().with_key_points(x_bold).with_light_points(x_light),
                (y_lo..y_hi).log_scale().with_key_points(y_bold).with_light_points(y_light),
            )
            .map_err(plotting)?;
        chart
            .configure_mesh()
            .x_desc("queued inspections (log scale)")
            .y_desc("median time per operation (ms, log scale)")
            .x_label_formatter(&|v| tick_count(*v))
            .y_label_formatter(&|v| tick(*v))
            .bold_line_style(MESH_BOLD)
            .light_line_style(MESH_LIGHT)
            .axis_desc_style((FONT, 17))
            .label_style((FONT, 15))
            .draw()
            .map_err(plotting)?;
        for (_, old, color, pts) in &series {
            if *old {
                chart
                    .draw_series(DashedLineSeries::new(pts.iter().copied(), 10, 6, color.stroke_width(2)))
                    .map_err(plotting)?;
            } else {
                chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2))).map_err(plotting)?;
            }
            chart
                .draw_series(pts.iter().map(|&(x, y)| {
                    EmptyElement::at((x, y))
                        + Circle::new((0, 0), 4, color.filled())
                        + Text::new(fmt_ms(y), (8, -8), small(*color).pos(Pos::new(HPos::Left, VPos::Bottom)))
                }))
                .map_err(plotting)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ironguard_netns_tests::faults::Fault;
    use serde_json::json;

    use super::*;
    use crate::stats::Samples;

    fn d(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1e3)
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// The SVG parsed as XML; its root must be `<svg>` and the document must start with it.
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        assert!(svg.starts_with("<svg"), "not an SVG document: {}", &svg[..svg.len().min(80)]);
        let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc
    }

    fn elements<'a>(doc: &'a roxmltree::Document<'a>, tag: &'a str) -> impl Iterator<Item = roxmltree::Node<'a, 'a>> {
        doc.descendants().filter(move |n| n.is_element() && n.tag_name().name() == tag)
    }

    /// The text of every `<text>` element.
    fn texts(doc: &roxmltree::Document<'_>) -> Vec<String> {
        elements(doc, "text").map(|n| n.text().unwrap_or("").trim().to_string()).collect()
    }

    fn has_text(doc: &roxmltree::Document<'_>, want: &str) -> bool {
        texts(doc).iter().any(|t| t.contains(want))
    }

    /// Circles filled with `color`.
    fn filled_circles(doc: &roxmltree::Document<'_>, color: RGBColor) -> usize {
        elements(doc, "circle").filter(|n| n.attribute("fill") == Some(hex(color).as_str())).count()
    }

    /// Circles drawn as a ring of `color`.
    fn hollow_circles(doc: &roxmltree::Document<'_>, color: RGBColor) -> usize {
        elements(doc, "circle")
            .filter(|n| n.attribute("fill") == Some("none") && n.attribute("stroke") == Some(hex(color).as_str()))
            .count()
    }

    /// The number of points of each polyline stroked with `color`.
    fn polylines(doc: &roxmltree::Document<'_>, color: RGBColor) -> Vec<usize> {
        elements(doc, "polyline")
            .filter(|n| n.attribute("stroke") == Some(hex(color).as_str()))
            .map(|n| n.attribute("points").unwrap_or("").split_whitespace().count())
            .collect()
    }

    /// Rectangles filled with `color`.
    fn filled_rects(doc: &roxmltree::Document<'_>, color: RGBColor) -> usize {
        elements(doc, "rect").filter(|n| n.attribute("fill") == Some(hex(color).as_str())).count()
    }

    /// The y of the `<text>` that is exactly `want`.
    fn text_y(doc: &roxmltree::Document<'_>, want: &str) -> i64 {
        let n = elements(doc, "text")
            .find(|n| n.text().map(str::trim) == Some(want))
            .unwrap_or_else(|| panic!("no text {want:?}"));
        n.attribute("y").and_then(|y| y.parse().ok()).expect("a numeric y")
    }

    /// A dataplane JSON as the benchmark writes it (its builders; the rest of the keys as in `dataplane::run`).
    fn dataplane_sample() -> Value {
        let loads: Vec<Value> = [(1000, 1.8, 11.1), (10_000, 16.7, 64.1), (100_000, 190.1, 548.1)]
            .into_iter()
            .map(|(n, ig, nf)| {
                crate::dataplane::full_load_json(n, &Samples::new(vec![d(ig); 5]), &Samples::new(vec![d(nf); 5]))
            })
            .collect();
        json!({
            "full_load": loads,
            "one_mac": {"at": 100000, "reps": 200, "add_p50_ms": 0.012},
            "mode_switch": [{"macs": 100000, "p50_ms": 0.126, "p99_ms": 0.309}],
            "mode_switch_nft_f_p50_ms": 16.1,
            "iptables_per_mac": crate::dataplane::iptables_json(2000, d(3250.0), d(1.625), d(1.4), "iptables v1.8.9 (nf_tables)"),
            "kernel": "6.1.0-test",
            "nft_version": "nftables v1.0.6 (Lester Gooch #5)",
        })
    }

    #[test]
    fn dataplane_chart_has_every_series_and_point() {
        let svg = dataplane_svg(&dataplane_sample()).expect("chart");
        let doc = parse(&svg);
        for want in [
            "Full load: ironguard vs nft -f vs iptables per MAC",
            "set size: MACs in the deny set (log scale)",
            "full-load time (ms, log scale)",
            "ironguard (netlink batch, in-process)",
            "nft -f (same content)",
            "iptables, one process per MAC (measured, 2000 MACs)",
            "iptables, extrapolated: 1.62 ms per MAC × MACs (not measured)",
            "kernel 6.1.0-test",
            "190.1 ms",
            "548.1 ms",
            "3250.0 ms",
            "≈ 162.5 s",
            "median of 5 loads per size",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        // One marker per measured point, plus the legend's.
        assert_eq!(filled_circles(&doc, IRONGUARD), 3 + 1);
        assert_eq!(filled_circles(&doc, NFT_F), 3 + 1);
        assert_eq!(filled_circles(&doc, IPTABLES), 1 + 1);
        // The extrapolation's value at each full-load size.
        assert_eq!(hollow_circles(&doc, IPTABLES), 3);
        // Its dashed line: many short strokes, beyond the legend's two.
        assert!(polylines(&doc, IPTABLES).len() > 10, "no dashed extrapolation");
        // The measured lines go through every size.
        assert_eq!(polylines(&doc, IRONGUARD).iter().filter(|p| **p == 3).count(), 1);
        assert_eq!(polylines(&doc, NFT_F).iter().filter(|p| **p == 3).count(), 1);
        // Tick labels on the MAC axis.
        for tick in ["1k", "10k", "100k"] {
            assert!(texts(&doc).iter().any(|t| t == tick), "no tick {tick}");
        }
    }

    #[test]
    fn dataplane_chart_follows_the_data() {
        // A fourth size adds one marker to each measured series and one extrapolated value.
        let mut v = dataplane_sample();
        let extra =
            crate::dataplane::full_load_json(200_000, &Samples::new(vec![d(400.0)]), &Samples::new(vec![d(1100.0)]));
        v["full_load"].as_array_mut().expect("array").push(extra);
        let svg = dataplane_svg(&v).expect("chart");
        let doc = parse(&svg);
        assert_eq!(filled_circles(&doc, IRONGUARD), 4 + 1);
        assert_eq!(filled_circles(&doc, NFT_F), 4 + 1);
        assert_eq!(hollow_circles(&doc, IPTABLES), 4);
        assert!(has_text(&doc, "median of 1–5 loads per size"));
    }

    #[test]
    fn dataplane_errors_name_the_missing_field() {
        let mut v = dataplane_sample();
        v["full_load"][1].as_object_mut().expect("object").remove("nft_f_ms");
        let e = format!("{:#}", dataplane_svg(&v).expect_err("no nft_f_ms"));
        assert!(e.contains("full_load[1]") && e.contains("nft_f_ms"), "{e}");

        let mut v = dataplane_sample();
        v.as_object_mut().expect("object").remove("iptables_per_mac");
        let e = format!("{:#}", dataplane_svg(&v).expect_err("no iptables"));
        assert!(e.contains("iptables_per_mac"), "{e}");

        let mut v = dataplane_sample();
        v["full_load"][0]["ironguard_ms"] = json!(0.0);
        let e = format!("{:#}", dataplane_svg(&v).expect_err("zero on a log scale"));
        assert!(e.contains("full_load[0]") && e.contains("ironguard_ms") && e.contains("not > 0"), "{e}");

        let e = format!("{:#}", dataplane_svg(&json!({"full_load": "x"})).expect_err("not an array"));
        assert!(e.contains("`full_load` is not an array"), "{e}");
        let e = format!("{:#}", dataplane_svg(&json!([])).expect_err("not the dataplane's"));
        assert!(e.contains("no `full_load`"), "{e}");
    }

    /// An HA JSON as the benchmark writes it: three faults (`FaultResult::to_json`) and the guard tampering.
    fn ha_sample() -> Value {
        let mut out = serde_json::Map::new();
        for (fault, gaps) in [
            (Fault::CutControlPlane, vec![0.0, 0.0, 19.5]),
            (Fault::Sigterm, vec![16.4, 12.0, 26.4, 18.0]),
            (Fault::Sigkill, vec![2883.6, 3391.7, 2700.0]),
        ] {
            let r = crate::ha::FaultResult::sample(fault, gaps.into_iter().map(d).collect());
            out.insert(fault.name().into(), r.to_json());
        }
        out.insert(
            "guard_tamper_repair".into(),
            json!({"nft flush ruleset": {"rounds": 20, "p50_ms": 11.0, "p99_ms": 31.5, "max_ms": 31.5}}),
        );
        Value::Object(out)
    }

    #[test]
    fn ha_json_keeps_its_keys_and_adds_the_gaps() {
        let v = ha_sample();
        let s = &v["sigterm"];
        for key in [
            "rounds",
            "gap_p50_ms",
            "gap_p99_ms",
            "gap_max_ms",
            "dual_open_ms",
            "double_offers",
            "unknown_offers",
            "discovers",
            "kernel_stop_minus_lease_end_ms",
        ] {
            assert!(s.get(key).is_some(), "no {key}");
        }
        // Round order, not sorted.
        let gaps: Vec<f64> = s["gaps_ms"].as_array().expect("gaps_ms").iter().filter_map(Value::as_f64).collect();
        assert_eq!(gaps.len(), 4);
        assert!((gaps[1] - 12.0).abs() < 1e-6 && (gaps[2] - 26.4).abs() < 1e-6, "{gaps:?}");
    }

    #[test]
    fn ha_chart_has_a_row_per_fault_and_a_dot_per_round() {
        let svg = ha_svg(&ha_sample()).expect("chart");
        let doc = parse(&svg);
        for want in [
            "Failover gaps per fault",
            "gap (ms, log scale)",
            "fault (rounds)",
            "sigterm (4)",
            "sigkill (3)",
            "cut from control plane (3)",
            "each round (10 in all)",
            "p50",
            "p99",
            "max",
            "A gap of 0",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        assert!(!has_text(&doc, "guard_tamper_repair"), "the guard tampering is not a fault");
        // 8 gaps > 0 as dots (+ the legend's), the 2 gaps of 0 as rings at the edge.
        assert_eq!(filled_circles(&doc, ROUND), 8 + 1);
        assert_eq!(hollow_circles(&doc, ROUND), 2 + 1);
        // A p50, p99 and max tick per fault (+ the legend's).
        for color in [P50, P99, MAX] {
            assert_eq!(polylines(&doc, color).len(), 3 + 1, "ticks of {}", hex(color));
        }
        // The benchmark's fault order, top to bottom (not alphabetical).
        let (a, b, c) =
            (text_y(&doc, "sigterm (4)"), text_y(&doc, "sigkill (3)"), text_y(&doc, "cut from control plane (3)"));
        assert!(a < b && b < c, "rows out of order: {a} {b} {c}");
    }

    #[test]
    fn ha_chart_draws_summaries_without_gaps() {
        // A JSON from before `gaps_ms`: only the ticks, and a note saying so.
        let mut v = ha_sample();
        for (_, f) in v.as_object_mut().expect("object").iter_mut() {
            if let Some(f) = f.as_object_mut() {
                f.remove("gaps_ms");
            }
        }
        let svg = ha_svg(&v).expect("chart");
        let doc = parse(&svg);
        assert_eq!(filled_circles(&doc, ROUND) + hollow_circles(&doc, ROUND), 0);
        assert_eq!(polylines(&doc, P99).len(), 3 + 1);
        assert!(has_text(&doc, "3 of 3 faults have no per-round gaps"), "{:?}", texts(&doc));
    }

    #[test]
    fn ha_errors_name_the_missing_field() {
        let mut v = ha_sample();
        v["sigkill"].as_object_mut().expect("object").remove("gap_p99_ms");
        let e = format!("{:#}", ha_svg(&v).expect_err("no gap_p99_ms"));
        assert!(e.contains("sigkill") && e.contains("gap_p99_ms"), "{e}");

        let mut v = ha_sample();
        v["sigterm"]["gaps_ms"] = json!([1.0, "x"]);
        let e = format!("{:#}", ha_svg(&v).expect_err("a gap that is no number"));
        assert!(e.contains("sigterm") && e.contains("gaps_ms"), "{e}");

        let e = format!("{:#}", ha_svg(&json!({"guard_tamper_repair": {}})).expect_err("no fault"));
        assert!(e.contains("no fault"), "{e}");
        let e = format!("{:#}", ha_svg(&json!([1, 2])).expect_err("not an object"));
        assert!(e.contains("not an object"), "{e}");
    }

    /// 20 callbacks: reply 0.5, 1.0, … 10 ms; callback → finished 50, 60, … 240 ms.
    fn callbacks_sample() -> Value {
        let samples: Vec<(Duration, u64)> = (0..20).map(|i| (d(0.5 * (i + 1) as f64), 50 + 10 * i as u64)).collect();
        crate::callbacks::sample_json(&samples)
    }

    #[test]
    fn callbacks_chart_has_a_vertex_per_callback() {
        let v = callbacks_sample();
        let svg = callbacks_svg(&v).expect("chart");
        let doc = parse(&svg);
        for want in [
            "Ramdisk callbacks (/v1/continue): latency distribution",
            "latency (ms, log scale)",
            "callbacks at or below (%)",
            "/v1/continue reply latency",
            "callback → inspection finished",
            "20 callbacks, 50 at once, 2 inspection workers, real Ironic 39.0.0",
            "p50 5.50 ms",
            "max 10.0 ms",
            "p99 240.0 ms",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        // Each CDF: one vertex per callback.
        assert_eq!(polylines(&doc, REPLY).iter().filter(|p| **p == 20).count(), 1, "{:?}", polylines(&doc, REPLY));
        assert_eq!(polylines(&doc, TO_FINISHED).iter().filter(|p| **p == 20).count(), 1);
        // p50, p99 and max on each curve (+ the legend's dot).
        assert_eq!(filled_circles(&doc, REPLY), 3 + 1);
        assert_eq!(filled_circles(&doc, TO_FINISHED), 3 + 1);
    }

    #[test]
    fn callbacks_errors_name_the_missing_field() {
        let mut v = callbacks_sample();
        v["callbacks"][3].as_object_mut().expect("object").remove("reply_ms");
        let e = format!("{:#}", callbacks_svg(&v).expect_err("no reply_ms"));
        assert!(e.contains("callbacks[3]") && e.contains("reply_ms"), "{e}");

        let mut v = callbacks_sample();
        v.as_object_mut().expect("object").remove("callback_to_finished_ms");
        let e = format!("{:#}", callbacks_svg(&v).expect_err("no summary"));
        assert!(e.contains("callback_to_finished_ms"), "{e}");

        let mut v = callbacks_sample();
        v["callbacks"] = json!([]);
        let e = format!("{:#}", callbacks_svg(&v).expect_err("empty"));
        assert!(e.contains("`callbacks` is empty"), "{e}");
    }

    #[test]
    fn site_chart_has_two_curves_per_scenario() {
        let svg = site_svg(&crate::site::sample_json()).expect("chart");
        let doc = parse(&svg);
        for want in [
            "Ironic inspecting nodes through the HA site: time to lease and to finished",
            "time from the node's inspect request (ms, log scale)",
            "nodes at or below (%)",
            "10 nodes inspected at once, 5 others, 2 rounds per scenario, etcd 3.5.16 (3 members), \
             Ironic 39.0.0 (3 conductors, MariaDB, json-rpc)",
            "no fault: boot → lease (p50 ",
            "max 550.0 ms",
            "leader host killed: inspect → finished (p50 ",
            "boot → lease (dark)",
            "inspect → finished (light)",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        // Each curve: one vertex per node of the scenario's rounds (no fault: 2 × 10; the host killed: 1 × 10).
        for (color, vertices) in [(BLUE_, 20), (LIGHT_BLUE, 20), (RED_, 10), (LIGHT_RED, 10)] {
            let lines = polylines(&doc, color);
            assert_eq!(lines.iter().filter(|p| **p == vertices).count(), 1, "{}: {lines:?}", hex(color));
            // p50, p99 and max on the curve (+ the legend's dot).
            assert_eq!(filled_circles(&doc, color), 3 + 1, "{}", hex(color));
        }
        // No conductor restart in the sample.
        assert!(polylines(&doc, GREEN_).is_empty() && polylines(&doc, LIGHT_GREEN).is_empty());
    }

    #[test]
    fn site_chart_counts_nodes_that_never_finished() {
        let mut v = crate::site::sample_json();
        v["scenarios"][0]["rounds"][1]["nodes"][4]["inspect_to_finished_ms"] = Value::Null;
        let doc_text = site_svg(&v).expect("chart");
        let doc = parse(&doc_text);
        // 19 vertices, the last at 95 %: the curve ends below 100 %.
        assert!(polylines(&doc, LIGHT_BLUE).contains(&19), "{:?}", polylines(&doc, LIGHT_BLUE));
        assert_eq!(polylines(&doc, BLUE_).iter().filter(|p| **p == 20).count(), 1);
    }

    #[test]
    fn site_errors_name_the_missing_field() {
        let mut v = crate::site::sample_json();
        v["scenarios"][1]["rounds"][0]["nodes"][3].as_object_mut().expect("object").remove("boot_to_lease_ms");
        let e = format!("{:#}", site_svg(&v).expect_err("no boot_to_lease_ms"));
        assert!(e.contains("scenarios[1]: rounds[0]: nodes[3]") && e.contains("boot_to_lease_ms"), "{e}");

        let mut v = crate::site::sample_json();
        v["scenarios"][0]["summary"].as_object_mut().expect("object").remove("inspect_to_finished_ms");
        let e = format!("{:#}", site_svg(&v).expect_err("no summary figure"));
        assert!(e.contains("scenarios[0]") && e.contains("inspect_to_finished_ms"), "{e}");

        let mut v = crate::site::sample_json();
        v["scenarios"][0]["summary"]["boot_to_lease_ms"].as_object_mut().expect("object").remove("p99");
        let e = format!("{:#}", site_svg(&v).expect_err("no p99"));
        assert!(e.contains("boot_to_lease_ms") && e.contains("p99"), "{e}");

        let mut v = crate::site::sample_json();
        v["scenarios"][0]["rounds"][0]["nodes"][0]["boot_to_lease_ms"] = json!("x");
        let e = format!("{:#}", site_svg(&v).expect_err("not a number"));
        assert!(e.contains("nodes[0]") && e.contains("not a number"), "{e}");

        let e = format!("{:#}", site_svg(&json!({"scenarios": []})).expect_err("empty"));
        assert!(e.contains("`scenarios` is empty"), "{e}");
        let e = format!("{:#}", site_svg(&json!({"full_load": []})).expect_err("not the site's"));
        assert!(e.contains("no `scenarios`"), "{e}");
    }

    fn filters_sample() -> Value {
        let one = Samples::new((1..=100).map(|i| d(1.0 + i as f64 * 0.03)).collect());
        let three = Samples::new((1..=100).map(|i| d(2.0 + i as f64 * 0.02)).collect());
        json!({
            "loaded": 10000,
            "latency_1_agent": crate::filters::latency_json(&one),
            "latency_3_agents": crate::filters::latency_json(&three),
            "burst": {"updates": 10000},
        })
    }

    #[test]
    fn filters_chart_has_a_bar_per_figure() {
        let svg = filters_svg(&filters_sample()).expect("chart");
        let doc = parse(&svg);
        for want in [
            "latency (ms)",
            "agents",
            "1 agent, 100 updates",
            "3 agents (all of them), 100 updates",
            "p50",
            "p99",
            "10000 MACs loaded",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        // p50 and p99 for 1 and for 3 agents (+ the legend's swatch).
        assert_eq!(filled_rects(&doc, BAR_P50), 2 + 1);
        assert_eq!(filled_rects(&doc, BAR_P99), 2 + 1);

        let mut v = filters_sample();
        v["latency_3_agents"].as_object_mut().expect("object").remove("p99_ms");
        let e = format!("{:#}", filters_svg(&v).expect_err("no p99"));
        assert!(e.contains("latency_3_agents") && e.contains("p99_ms"), "{e}");
    }

    /// Two sizes; at 100 clients dnsmasq alone and the site lease everyone, a faulted storm leases 3 of 4.
    fn storm_sample() -> Value {
        let ttl = |k: usize, base: f64| (0..k).map(|i| base + i as f64).collect::<Vec<f64>>();
        json!({
            "schedule_s": [4.0, 8.0, 16.0, 32.0], "spread_ms": 1000,
            "sizes": [
                {"clients": 100, "scenarios": [
                    {"key": "alone", "name": "dnsmasq alone (no ironguard)", "clients": 10, "time_to_lease_ms": ttl(10, 2.0)},
                    {"key": "ironguard", "name": "ironguard, no fault", "clients": 10, "time_to_lease_ms": ttl(10, 2.1)},
                    {"key": "sigstop_dnsmasq", "name": "ironguard, leader's dnsmasq SIGSTOPped", "clients": 4, "time_to_lease_ms": [3.0, 4.0, 4100.0]},
                ]},
                {"clients": 500, "scenarios": [
                    {"key": "alone", "name": "dnsmasq alone (no ironguard)", "clients": 5, "time_to_lease_ms": ttl(5, 3.0)},
                    {"key": "ironguard", "name": "ironguard, no fault", "clients": 5, "time_to_lease_ms": ttl(5, 3.2)},
                ]},
            ]
        })
    }

    #[test]
    fn storm_chart_has_a_panel_per_size_and_a_curve_per_scenario() {
        let svg = storm_svg(&storm_sample()).expect("chart");
        let doc = parse(&svg);
        for want in [
            "Boot storm: clients leased against time to lease",
            "100 clients",
            "500 clients",
            "time to lease (ms, log scale)",
            "clients leased (%)",
            "dnsmasq alone (no ironguard)",
            "ironguard, no fault",
            "ironguard, leader's dnsmasq SIGSTOPped",
            "75.0 %",
            "99.9",
        ] {
            assert!(has_text(&doc, want), "no text {want:?} in {:?}", texts(&doc));
        }
        // A curve per scenario and panel (+ the legend's line), one vertex per lease.
        let alone = polylines(&doc, NFT_F);
        assert_eq!(alone.len(), 2 + 1, "{alone:?}");
        assert!(alone.contains(&10) && alone.contains(&5), "a vertex per lease: {alone:?}");
        assert_eq!(polylines(&doc, IRONGUARD).len(), 2 + 1);
        assert_eq!(polylines(&doc, GREEN_), vec![2, 3], "the legend's line, then 3 leases");
        // Each curve ends in a dot (+ the legend's).
        assert_eq!(filled_circles(&doc, GREEN_), 1 + 1);
    }

    #[test]
    fn storm_errors_name_the_missing_field() {
        let mut v = storm_sample();
        v["sizes"][1]["scenarios"][0].as_object_mut().expect("object").remove("time_to_lease_ms");
        let e = format!("{:#}", storm_svg(&v).expect_err("no time_to_lease_ms"));
        assert!(e.contains("sizes[1]") && e.contains("time_to_lease_ms"), "{e}");
        let mut v = storm_sample();
        v["sizes"][0]["scenarios"][2]["clients"] = json!(2);
        let e = format!("{:#}", storm_svg(&v).expect_err("more leases than clients"));
        assert!(e.contains("2 clients, 3 leases"), "{e}");
        let e = format!("{:#}", storm_svg(&json!({"sizes": []})).expect_err("empty"));
        assert!(e.contains("`sizes` is empty"), "{e}");
    }

    #[test]
    fn svg_dispatches_by_kind() {
        assert!(svg(Kind::Storm, &storm_sample()).is_ok());
        assert!(svg(Kind::Storm, &ha_sample()).is_err());
        assert!(svg(Kind::Dataplane, &dataplane_sample()).is_ok());
        assert!(svg(Kind::Ha, &ha_sample()).is_ok());
        assert!(svg(Kind::Callbacks, &callbacks_sample()).is_ok());
        assert!(svg(Kind::Filters, &filters_sample()).is_ok());
        assert!(svg(Kind::Site, &crate::site::sample_json()).is_ok());
        assert!(svg(Kind::Site, &ha_sample()).is_err());
        // Another benchmark's JSON is refused with a message, not drawn as nonsense.
        assert!(svg(Kind::Ha, &dataplane_sample()).is_err());
        assert!(svg(Kind::Dataplane, &ha_sample()).is_err());
    }

    #[test]
    fn log_ticks_are_1_2_5() {
        let (bold, light) = log_ticks(0.5, 300.0);
        assert_eq!(bold, vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]);
        let has = |v: &[f64], x: f64| v.iter().any(|y| (y - x).abs() < 1e-9);
        assert!(has(&light, 3.0) && has(&light, 0.7) && !has(&light, 2.0), "{light:?}");
        let (bold, _) = log_ticks(0.5, 1e6);
        assert_eq!(bold, vec![1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0, 1_000_000.0]);
        assert_eq!(tick_count(100_000.0), "100k");
        assert_eq!(tick(0.2), "0.2");
        assert_eq!(tick(0.05), "0.05");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick_linear(0.0), "0");
        assert_eq!(tick_linear(1.5), "1.5");
        assert_eq!(tick_linear(0.30000000000000004), "0.3");
        assert_eq!(fmt_ms(0.012), "12 µs");
    }

    #[test]
    fn queue_chart_draws_a_line_per_operation_and_algorithm() {
        let rows: Vec<Value> = [10.0, 100.0, 1000.0]
            .iter()
            .flat_map(|&n: &f64| {
                ["take", "pending", "enqueue"].map(
                    |op| serde_json::json!({"length": n, "op": op, "new_p50_ms": 5.0, "old_p50_ms": n / 10.0 + 1.0}),
                )
            })
            .collect();
        let svg = queue_svg(&serde_json::json!({"etcd": "3.4", "rows": rows})).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let lines = doc.descendants().filter(|n| n.tag_name().name() == "polyline").count();
        assert!(lines >= 6, "{lines} lines");
        assert!(queue_svg(&serde_json::json!({"rows": []})).is_err(), "no rows: an error, not an empty chart");
    }
}
