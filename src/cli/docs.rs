//! The command line described for the shell and for `man`: completion scripts
//! (clap_complete) and manual pages (clap_mangen), both made from the same clap
//! definitions as `--help`, so they cannot drift from it.

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use super::{exit, Cli, Out};

/// `optimizerd completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell, out: &mut Out) -> anyhow::Result<u8> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "optimizerd", &mut script);
    out.bytes(&script)?;
    Ok(exit::SUCCESS)
}

/// `optimizerd man`: the page of `optimizerd` on stdout, or with `--out DIR` one page
/// per command (`optimizerd.1`, `optimizerd-start.1`, ...) written into DIR.
pub fn man(dir: Option<&Path>, out: &mut Out) -> anyhow::Result<u8> {
    let cmd = Cli::command();
    let Some(dir) = dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        out.bytes(&page)?;
        return Ok(exit::SUCCESS);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut pages = vec![("optimizerd.1".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("optimizerd-{}", sub.get_name());
        let page = sub.clone().display_name(name.clone()).bin_name(format!("optimizerd {}", sub.get_name()));
        pages.push((format!("{name}.1"), page));
    }
    for (file, page) in pages {
        let path = dir.join(&file);
        let mut text = Vec::new();
        clap_mangen::Man::new(page).render(&mut text)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        out.line(&path.display().to_string())?;
    }
    Ok(exit::SUCCESS)
}
