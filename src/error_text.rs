//! An error and its causes as one line, each cause said once: `what: why: why`. A cause
//! whose text the line already holds (a message that embeds its source) is left out, so
//! nothing is repeated whoever wrote the messages. A leaf that any module may call.

use std::error::Error;

/// `e` and every cause below it, joined with `: `, each text once.
pub fn chain(e: &(dyn Error + 'static)) -> String {
    let mut all = vec![e];
    while let Some(cause) = all[all.len() - 1].source() {
        all.push(cause);
    }
    join(all)
}

/// The texts of `errors` (outermost first), joined with `: `, skipping any the line holds already.
pub fn join<'a>(errors: impl IntoIterator<Item = &'a (dyn Error + 'static)>) -> String {
    let mut line = String::new();
    for e in errors {
        let text = e.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the ledger runs/optimizer.db")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped: {0}")]
    struct Repeats(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("file is not a database")]
    struct Inner;

    #[test]
    fn each_cause_is_said_once() {
        assert_eq!(super::chain(&Outer(Inner)), "cannot open the ledger runs/optimizer.db: file is not a database");
        assert_eq!(super::chain(&Repeats(Inner)), "wrapped: file is not a database");
    }
}
