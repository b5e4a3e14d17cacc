//! The agent's reply format, parsed strictly, and its application to a template.
//!
//! A reply (one choice) is one proposal: a `SUMMARY:` line, then either search/replace
//! blocks
//!
//! ```text
//! <<<<<<< SEARCH
//! lines copied exactly from the template
//! =======
//! their replacement
//! >>>>>>> REPLACE
//! ```
//!
//! or one whole template between `<<<<<<< TEMPLATE` and `>>>>>>> TEMPLATE`. Prose and
//! code fences around blocks are ignored; anything that targets other files (a unified
//! diff, a file name after a marker) or is malformed is a rejection with its reason.

/// Most search/replace blocks one proposal may carry.
pub const MAX_EDITS: usize = 24;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub search: String,
    pub replace: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Edits(Vec<Edit>),
    Whole(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// One line, for `history` and the commit message.
    pub summary: String,
    pub body: Body,
}

const SEARCH: &str = "<<<<<<< SEARCH";
const DIVIDER: &str = "=======";
const REPLACE: &str = ">>>>>>> REPLACE";
const TEMPLATE_OPEN: &str = "<<<<<<< TEMPLATE";
const TEMPLATE_CLOSE: &str = ">>>>>>> TEMPLATE";

/// Parse one choice's text. Err: why it is not a usable proposal.
pub fn parse(reply: &str) -> Result<Proposal, String> {
    let mut summary: Option<String> = None;
    let mut edits: Vec<Edit> = Vec::new();
    let mut whole: Option<String> = None;
    let lines: Vec<&str> = reply.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let raw = lines[i];
        let t = raw.trim_end();
        let n = i + 1;
        if let Some(s) = t.trim_start().strip_prefix("SUMMARY:") {
            if summary.is_none() {
                let s = s.trim();
                if s.is_empty() {
                    return Err(format!("line {n}: SUMMARY: is empty; give one line saying what the edit changes"));
                }
                summary = Some(s.chars().take(160).collect());
            }
            i += 1;
            continue;
        }
        if t.starts_with("diff --git") || t.starts_with("--- a/") || t.starts_with("+++ b/") || t.starts_with("*** ") {
            return Err(format!("line {n}: {t:?} is a patch of files; only search/replace blocks against the template are accepted"));
        }
        if t.starts_with("<<<<<<<") && t != SEARCH && t != TEMPLATE_OPEN {
            return Err(format!("line {n}: {t:?}: markers take no file name or other words; write exactly `{SEARCH}` or `{TEMPLATE_OPEN}`"));
        }
        if t == TEMPLATE_OPEN {
            if whole.is_some() || !edits.is_empty() {
                return Err(format!("line {n}: a proposal is either search/replace blocks or one whole template, not both"));
            }
            let close = (i + 1..lines.len())
                .find(|&j| lines[j].trim_end() == TEMPLATE_CLOSE)
                .ok_or_else(|| format!("line {n}: `{TEMPLATE_OPEN}` is never closed by `{TEMPLATE_CLOSE}`"))?;
            whole = Some(join(&lines[i + 1..close]));
            i = close + 1;
            continue;
        }
        if t == SEARCH {
            if whole.is_some() {
                return Err(format!("line {n}: a proposal is either search/replace blocks or one whole template, not both"));
            }
            let mut j = i + 1;
            let mut divider = None;
            let mut end = None;
            while j < lines.len() {
                let u = lines[j].trim_end();
                if u == SEARCH || u == TEMPLATE_OPEN {
                    return Err(format!("line {}: a new block opens before the block of line {n} is closed by `{REPLACE}`", j + 1));
                }
                if u == DIVIDER {
                    if divider.is_some() {
                        return Err(format!("line {}: a second `{DIVIDER}` in the block of line {n}", j + 1));
                    }
                    divider = Some(j);
                } else if u == REPLACE {
                    end = Some(j);
                    break;
                }
                j += 1;
            }
            let end = end.ok_or_else(|| format!("line {n}: block is never closed by `{REPLACE}`"))?;
            let divider = divider.ok_or_else(|| format!("line {n}: block has no `{DIVIDER}` between the search and the replacement"))?;
            let search = join(&lines[i + 1..divider]);
            let replace = join(&lines[divider + 1..end]);
            if search.trim().is_empty() {
                return Err(format!("line {n}: empty SEARCH; copy the exact lines to replace from the template"));
            }
            if search == replace {
                return Err(format!("line {n}: SEARCH and REPLACE are identical"));
            }
            edits.push(Edit { search, replace });
            if edits.len() > MAX_EDITS {
                return Err(format!("more than {MAX_EDITS} blocks in one proposal"));
            }
            i = end + 1;
            continue;
        }
        if t == DIVIDER || t == REPLACE || t == TEMPLATE_CLOSE {
            return Err(format!("line {n}: `{t}` outside a block"));
        }
        i += 1;
    }
    let summary = summary.ok_or_else(|| "no `SUMMARY:` line; start the reply with one line saying what the edit changes".to_string())?;
    let body = match whole {
        Some(w) => Body::Whole(w),
        None if edits.is_empty() => return Err("no search/replace block and no whole template".into()),
        None => Body::Edits(edits),
    };
    Ok(Proposal { summary, body })
}

fn join(lines: &[&str]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// Apply `proposal` to `template`. Err: which block does not apply and why.
pub fn apply(template: &str, proposal: &Proposal) -> Result<String, String> {
    let out = match &proposal.body {
        Body::Whole(w) => w.clone(),
        Body::Edits(edits) => {
            let mut text = template.to_string();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            for (k, e) in edits.iter().enumerate() {
                let found = text.matches(e.search.as_str()).count();
                let first = e.search.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
                match found {
                    0 => return Err(format!("block {}: SEARCH text not found in the template (its first line: {first:?}); copy lines exactly", k + 1)),
                    1 => text = text.replacen(e.search.as_str(), &e.replace, 1),
                    n => return Err(format!("block {}: SEARCH text occurs {n} times (first line: {first:?}); include more context so it is unique", k + 1)),
                }
            }
            text
        }
    };
    if out.trim_end() == template.trim_end() {
        return Err("the proposal leaves the template unchanged".into());
    }
    Ok(out)
}

/// Unified diff of `before` -> `after` (the commit message and the ledger keep it).
pub fn diff(before: &str, after: &str, file: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{file}"), &format!("b/{file}"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "int a = 1;\nint b = 2;\nint c = 3;\n";

    #[test]
    fn a_block_applies_once() {
        let p = parse("Here it is.\nSUMMARY: b becomes 5\n```\n<<<<<<< SEARCH\nint b = 2;\n=======\nint b = 5;\n>>>>>>> REPLACE\n```\n").unwrap();
        assert_eq!(p.summary, "b becomes 5");
        assert_eq!(apply(T, &p).unwrap(), "int a = 1;\nint b = 5;\nint c = 3;\n");
        assert!(diff(T, &apply(T, &p).unwrap(), "t.cu").contains("+int b = 5;"));
    }

    #[test]
    fn malformed_replies_say_why() {
        let cases = [
            ("<<<<<<< SEARCH\nint b = 2;\n=======\nx\n>>>>>>> REPLACE\n", "SUMMARY"),
            ("SUMMARY: x\n<<<<<<< SEARCH\nint b = 2;\n=======\nx\n", "never closed"),
            ("SUMMARY: x\n<<<<<<< SEARCH\nint b = 2;\n>>>>>>> REPLACE\n", "no `=======`"),
            ("SUMMARY: x\n<<<<<<< SEARCH other.cuh\nint b;\n=======\nx\n>>>>>>> REPLACE\n", "file name"),
            ("SUMMARY: x\ndiff --git a/x b/x\n", "patch of files"),
            ("SUMMARY: x\n", "no search/replace block"),
            ("SUMMARY: x\n<<<<<<< SEARCH\n\n=======\nx\n>>>>>>> REPLACE\n", "empty SEARCH"),
        ];
        for (reply, why) in cases {
            let e = parse(reply).unwrap_err();
            assert!(e.contains(why), "{reply:?}: {e}");
        }
    }

    #[test]
    fn blocks_that_do_not_apply_are_refused() {
        let missing = parse("SUMMARY: x\n<<<<<<< SEARCH\nint z = 9;\n=======\nx\n>>>>>>> REPLACE\n").unwrap();
        assert!(apply(T, &missing).unwrap_err().contains("not found"));
        let twice = parse("SUMMARY: x\n<<<<<<< SEARCH\nint\n=======\nlong\n>>>>>>> REPLACE\n").unwrap();
        assert!(apply("int\nint\n", &twice).unwrap_err().contains("2 times"));
        let same = parse("SUMMARY: x\n<<<<<<< TEMPLATE\nint a = 1;\nint b = 2;\nint c = 3;\n>>>>>>> TEMPLATE\n").unwrap();
        assert!(apply(T, &same).unwrap_err().contains("unchanged"));
    }
}
