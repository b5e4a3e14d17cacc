//! The run's workspace: a git repository of the kernel being optimized.
//!
//! Each candidate is committed (source + params) on top of `best` before it is
//! compiled. If it wins, a follow-up commit files it under `kernels/` for the shapes it
//! won and the `best` branch advances, so `git log best` is the lineage of
//! improvements. If it loses, the commit is kept under `refs/rejected/<seq>` for
//! inspection and the working tree is reset hard to `best`.

use std::path::{Path, PathBuf};

use git2::{Oid, Repository, Signature};

pub const BEST: &str = "refs/heads/best";
pub const CANDIDATE: &str = "refs/heads/candidate";

#[derive(Debug, thiserror::Error)]
#[error("workspace {dir}: {what}")]
pub struct WorkspaceError {
    pub dir: PathBuf,
    pub what: String,
    #[source]
    pub source: git2::Error,
}

type Result<T> = std::result::Result<T, WorkspaceError>;

pub struct Workspace {
    repo: Repository,
    dir: PathBuf,
}

impl Workspace {
    /// Create the repository with a first commit on `best` holding `files`.
    pub fn init(dir: &Path, files: &[(&str, &str)]) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| wrap(dir, "create folder", git2::Error::from_str(&e.to_string())))?;
        no_object_cache();
        let repo = Repository::init(dir).map_err(|e| wrap(dir, "git init", e))?;
        let ws = Workspace { repo, dir: dir.to_path_buf() };
        ws.repo.set_head(BEST).map_err(|e| ws.err("point HEAD at best", e))?;
        ws.commit_files(files, None, "workspace created", Some(BEST))?;
        Ok(ws)
    }

    pub fn open(dir: &Path) -> Result<Self> {
        no_object_cache();
        let repo = Repository::open(dir).map_err(|e| wrap(dir, "open", e))?;
        Ok(Workspace { repo, dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn err(&self, what: impl Into<String>, source: git2::Error) -> WorkspaceError {
        wrap(&self.dir, what, source)
    }

    pub fn best_tip(&self) -> Result<Oid> {
        self.repo.refname_to_id(BEST).map_err(|e| self.err("read best", e))
    }

    /// Commit a candidate's files on top of `best`; HEAD follows `candidate`.
    pub fn commit_candidate(&self, files: &[(&str, &str)], message: &str) -> Result<Oid> {
        let parent = self.best_tip()?;
        let oid = self.commit_files(files, Some(parent), message, Some(CANDIDATE))?;
        self.repo.set_head(CANDIDATE).map_err(|e| self.err("point HEAD at candidate", e))?;
        Ok(oid)
    }

    /// The candidate won: commit `files` on top of it and advance `best` there.
    pub fn accept(&self, candidate: Oid, files: &[(&str, &str)], message: &str) -> Result<Oid> {
        let oid = self.commit_files(files, Some(candidate), message, Some(BEST))?;
        self.repo.set_head(BEST).map_err(|e| self.err("point HEAD at best", e))?;
        self.reset_to_best()?;
        Ok(oid)
    }

    /// The candidate lost (or failed): keep it under `refs/rejected/<seq>`, reset to `best`.
    pub fn revert(&self, candidate: Oid, seq: i64) -> Result<()> {
        self.repo
            .reference(&format!("refs/rejected/{seq}"), candidate, true, "rejected candidate")
            .map_err(|e| self.err("keep rejected candidate", e))?;
        self.repo.set_head(BEST).map_err(|e| self.err("point HEAD at best", e))?;
        self.reset_to_best()
    }

    /// After a crash: remove lock files a killed process left behind (we hold the run's
    /// GPU lock, so no other writer exists), point HEAD at `best` and reset hard to it.
    pub fn recover(&self) -> Result<()> {
        let git_dir = self.repo.path().to_path_buf();
        for rel in ["index.lock", "HEAD.lock", "refs/heads/best.lock", "refs/heads/candidate.lock"] {
            let p = git_dir.join(rel);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|e| self.err(format!("remove stale {}", p.display()), io(e)))?;
            }
        }
        if let Ok(rd) = std::fs::read_dir(git_dir.join("refs/rejected")) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "lock") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        self.repo.set_head(BEST).map_err(|e| self.err("point HEAD at best", e))?;
        self.reset_to_best()
    }

    /// Point `best` at `target` (the ledger's last recorded acceptance, or the first
    /// commit when nothing was accepted): a daemon killed between advancing `best` and
    /// recording the iteration leaves git ahead of the ledger, and the ledger is the
    /// truth. The orphaned tip is kept under `refs/unrecorded/<short id>`.
    pub fn align_best(&self, target: Option<Oid>) -> Result<bool> {
        let target = match target {
            Some(t) => t,
            None => self.root()?,
        };
        let tip = self.best_tip()?;
        if tip == target {
            return Ok(false);
        }
        self.repo
            .reference(&format!("refs/unrecorded/{}", &tip.to_string()[..12]), tip, true, "best tip not in the ledger")
            .map_err(|e| self.err("keep unrecorded tip", e))?;
        self.repo.reference(BEST, target, true, "align best with the ledger").map_err(|e| self.err("move best", e))?;
        self.reset_to_best()?;
        Ok(true)
    }

    /// The first commit on `best`.
    fn root(&self) -> Result<Oid> {
        let mut walk = self.repo.revwalk().map_err(|e| self.err("revwalk", e))?;
        walk.push(self.best_tip()?).map_err(|e| self.err("revwalk", e))?;
        let mut last = None;
        for oid in walk {
            last = Some(oid.map_err(|e| self.err("revwalk", e))?);
        }
        last.ok_or_else(|| self.err("find the first commit", git2::Error::from_str("best has no commits")))
    }

    /// `git reset --hard best`: index and working tree back to the incumbent.
    pub fn reset_to_best(&self) -> Result<()> {
        let tip = self.best_tip()?;
        let obj = self.repo.find_object(tip, None).map_err(|e| self.err("find best", e))?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.force().remove_untracked(true);
        self.repo
            .reset(&obj, git2::ResetType::Hard, Some(&mut co))
            .map_err(|e| self.err("reset --hard best", e))
    }

    /// True when the working tree and index match HEAD exactly (no untracked files either).
    pub fn is_clean(&self) -> Result<bool> {
        let mut opts = git2::StatusOptions::new();
        opts.include_untracked(true).recurse_untracked_dirs(true);
        let st = self.repo.statuses(Some(&mut opts)).map_err(|e| self.err("status", e))?;
        Ok(st.is_empty())
    }

    /// The symbolic target of HEAD, e.g. `refs/heads/best`.
    pub fn head_ref(&self) -> Result<String> {
        let head = self.repo.find_reference("HEAD").map_err(|e| self.err("read HEAD", e))?;
        Ok(head.symbolic_target().unwrap_or_default().to_string())
    }

    /// A file's text as committed on `best` (whatever the working tree holds now).
    pub fn read_best(&self, rel: &str) -> Result<Option<String>> {
        let commit = self.repo.find_commit(self.best_tip()?).map_err(|e| self.err("read best", e))?;
        let tree = commit.tree().map_err(|e| self.err("read best tree", e))?;
        let entry = match tree.get_path(Path::new(rel)) {
            Ok(e) => e,
            Err(_) => return Ok(None),
        };
        let blob = self.repo.find_blob(entry.id()).map_err(|e| self.err(format!("read {rel}"), e))?;
        Ok(Some(String::from_utf8_lossy(blob.content()).into_owned()))
    }

    /// A file's text as committed in `commit` (a candidate's commit, kept on `best` or under
    /// `refs/rejected/<seq>`); None when the commit has no such file.
    pub fn read_at(&self, commit: &str, rel: &str) -> Result<Option<String>> {
        let oid = Oid::from_str(commit).map_err(|e| self.err(format!("read commit {commit}"), e))?;
        let commit = self.repo.find_commit(oid).map_err(|e| self.err(format!("read commit {oid}"), e))?;
        let tree = commit.tree().map_err(|e| self.err(format!("read the tree of {oid}"), e))?;
        let entry = match tree.get_path(Path::new(rel)) {
            Ok(e) => e,
            Err(_) => return Ok(None),
        };
        let blob = self.repo.find_blob(entry.id()).map_err(|e| self.err(format!("read {rel} at {oid}"), e))?;
        Ok(Some(String::from_utf8_lossy(blob.content()).into_owned()))
    }

    /// Commit messages of `best`, newest first.
    pub fn best_log(&self) -> Result<Vec<String>> {
        let mut walk = self.repo.revwalk().map_err(|e| self.err("revwalk", e))?;
        walk.push(self.best_tip()?).map_err(|e| self.err("revwalk", e))?;
        let mut out = Vec::new();
        for oid in walk {
            let oid = oid.map_err(|e| self.err("revwalk", e))?;
            let c = self.repo.find_commit(oid).map_err(|e| self.err("find commit", e))?;
            out.push(c.summary().unwrap_or_default().to_string());
        }
        Ok(out)
    }

    fn commit_files(&self, files: &[(&str, &str)], parent: Option<Oid>, message: &str, update: Option<&str>) -> Result<Oid> {
        for (rel, text) in files {
            let path = self.dir.join(rel);
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d).map_err(|e| self.err(format!("create {}", d.display()), io(e)))?;
            }
            std::fs::write(&path, text).map_err(|e| self.err(format!("write {}", path.display()), io(e)))?;
        }
        let mut index = self.repo.index().map_err(|e| self.err("open index", e))?;
        if let Some(p) = parent {
            // Start from the parent's tree so the index holds exactly parent + files.
            let tree = self.repo.find_commit(p).and_then(|c| c.tree()).map_err(|e| self.err("read parent tree", e))?;
            index.read_tree(&tree).map_err(|e| self.err("read parent tree", e))?;
        }
        for (rel, _) in files {
            index.add_path(Path::new(rel)).map_err(|e| self.err(format!("add {rel}"), e))?;
        }
        index.write().map_err(|e| self.err("write index", e))?;
        crate::failpoint::hit("git-mid-commit");
        let tree_id = index.write_tree().map_err(|e| self.err("write tree", e))?;
        let tree = self.repo.find_tree(tree_id).map_err(|e| self.err("find tree", e))?;
        let sig = Signature::now("optimizerd", "optimizerd@localhost").map_err(|e| self.err("signature", e))?;
        let parents: Vec<git2::Commit> = match parent {
            Some(p) => vec![self.repo.find_commit(p).map_err(|e| self.err("find parent", e))?],
            None => vec![],
        };
        let parent_refs: Vec<&git2::Commit> = parents.iter().collect();
        let oid = self.repo.commit(None, &sig, &sig, message, &tree, &parent_refs).map_err(|e| self.err("commit", e))?;
        if let Some(r) = update {
            self.repo.reference(r, oid, true, message).map_err(|e| self.err(format!("update {r}"), e))?;
        }
        Ok(oid)
    }
}


/// libgit2 caches every object it reads or writes, per process, up to 256 MB by default:
/// a daemon that commits a candidate per iteration and never reads one back grew ~1 KB an
/// iteration through it (the soak). The workspace gains nothing from the cache.
fn no_object_cache() {
    git2::opts::enable_caching(false);
}

fn wrap(dir: &Path, what: impl Into<String>, source: git2::Error) -> WorkspaceError {
    WorkspaceError { dir: dir.to_path_buf(), what: what.into(), source }
}

fn io(e: std::io::Error) -> git2::Error {
    git2::Error::from_str(&e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revert_restores_best_and_keeps_the_rejected_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::init(tmp.path(), &[("README.md", "hi\n")]).unwrap();
        let c1 = ws.commit_candidate(&[("candidate.cu", "one")], "iter 1").unwrap();
        ws.accept(c1, &[("kernels/a.cu", "one")], "accept 1").unwrap();
        let best = ws.best_tip().unwrap();
        let c2 = ws.commit_candidate(&[("candidate.cu", "two"), ("extra.txt", "x")], "iter 2").unwrap();
        assert_eq!(std::fs::read_to_string(tmp.path().join("candidate.cu")).unwrap(), "two");
        ws.revert(c2, 2).unwrap();
        assert_eq!(ws.best_tip().unwrap(), best);
        assert_eq!(ws.head_ref().unwrap(), BEST);
        assert!(ws.is_clean().unwrap());
        assert_eq!(std::fs::read_to_string(tmp.path().join("candidate.cu")).unwrap(), "one");
        assert!(!tmp.path().join("extra.txt").exists());
        let repo = Repository::open(tmp.path()).unwrap();
        assert_eq!(repo.refname_to_id("refs/rejected/2").unwrap(), c2);
        assert_eq!(ws.best_log().unwrap(), vec!["accept 1", "iter 1", "workspace created"]);
    }
}
