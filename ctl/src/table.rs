//! Plain-text tables: columns padded to their widest cell, two spaces apart, no trailing whitespace.

use std::fmt::Write as _;

/// A table being built row by row; [`Table::render`] lays it out.
#[derive(Debug, Clone, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first row is `header`.
    pub fn new(header: &[&str]) -> Self {
        Self { rows: vec![header.iter().map(|h| h.to_string()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// One line per row. Widths count characters, so non-ASCII reasons still line up.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| self.rows.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                let _ = write!(line, "{cell:<width$}  ");
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_the_widest_cell_without_trailing_spaces() {
        let mut t = Table::new(&["MAC", "WHY"]);
        t.row(vec!["52:54:00:12:34:56".into(), "api".into()]);
        t.row(vec!["x".into(), String::new()]);
        assert_eq!(t.render(), "MAC                WHY\n52:54:00:12:34:56  api\nx\n");
    }
}
