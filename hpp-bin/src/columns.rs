//! Tables as kubectl prints them, for every subcommand that shows rows to people.

/// Left-aligned columns separated by three spaces, the last one unpadded; no trailing newline.
pub fn columns(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                l.push_str(&format!("{cell:<w$}   "));
            }
        }
        l.trim_end().to_owned()
    };
    let mut out = vec![line(headers.to_vec())];
    out.extend(rows.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["a".to_owned(), "long value".to_owned()],
            vec!["bbbb".to_owned(), "x".to_owned()],
        ];
        assert_eq!(columns(&["K", "V"], &rows), "K      V\na      long value\nbbbb   x");
    }
}
