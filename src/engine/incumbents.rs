//! The incumbents: the best kernel for each shape, the modules the worker must hold
//! to time them, and their promotion when a candidate wins (workspace `best` and
//! `kernels/dispatch.json`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::storage::ledger::BestRow;
use crate::pipeline::outcome::{Failure, Verdict};
use crate::spec::protocol::{Launch, Loaded, ShapePlan, TensorMap, TimeCase};
use crate::pipeline::timing;
use crate::spec::template::Params;
use crate::pipeline::compile;

use super::{dedup, Engine};
use crate::strategy::diagnose::{diagnose, Figures, Finding};

/// The current best kernel for one shape.
#[derive(Debug, Clone)]
pub(super) struct Incumbent {
    pub(super) seq: i64,
    pub(super) id: String,
    pub(super) template: String,
    pub(super) params: Params,
    pub(super) plan: ShapePlan,
    pub(super) median_us: f64,
    pub(super) source_path: String,
}

/// One row of `kernels/dispatch.json`: which kernel serves a shape and how to launch it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct DispatchEntry {
    pub(super) iteration: i64,
    pub(super) template: String,
    pub(super) params: Params,
    pub(super) source: String,
    pub(super) median_us: f64,
    pub(super) n_splits: u32,
    pub(super) launches: Vec<Launch>,
    /// TMA tensor maps appended to every launch's parameters (templates with `[[tensor_map]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) tensor_maps: Vec<TensorMap>,
}

/// A compiled module the current worker holds: (id, source, kernels, plans for occupancy).
#[derive(Debug, Clone)]
pub(super) struct Module {
    /// What the last load reported (resources, occupancy), for the diagnosis.
    pub(super) loaded: Option<Loaded>,
    pub(super) source: String,
    /// NVRTC target it was built for (`sm_90`, or `sm_90a` for arch-specific templates).
    pub(super) arch: String,
    pub(super) kernels: Vec<String>,
    pub(super) plans: Vec<ShapePlan>,
    /// The head dims its build holds: those of the shapes it was loaded for, which the gate's
    /// last word (static shared memory, after the build) may narrow `plans` below. A reload
    /// builds these again, so that every kernel in `kernels` is found.
    pub(super) head_dims: Vec<u32>,
}

impl Engine {
    /// Compile+load a module, then reload nothing else: incumbents are reloaded lazily.
    pub(super) async fn load(&mut self, id: &str, source: &str, arch: &str, kernels: Vec<String>, plans: &[ShapePlan]) -> Result<Loaded, Failure> {
        self.sync_generation();
        let scope = self.build_scope(plans.iter().map(|p| p.shape.d));
        let l = compile::load(&mut self.sup, id, source, arch, &scope, kernels, plans, self.cfg.worker.load_timeout).await?;
        self.loaded.push(id.to_string());
        Ok(l)
    }

    /// What a build for shapes of head dims `dims` holds: those head dims' kernels
    /// (ascending) and no others, and the window's code only if some shape of the run has a
    /// window. A candidate builds the head dims of the shapes it is loaded for (the gate's
    /// plans): an open-phase class of one head dim, on a workload of two, compiles half the
    /// code (a Hopper build of both took ~3.5 s of NVRTC on the H200's host).
    pub(super) fn build_scope(&self, dims: impl IntoIterator<Item = u32>) -> crate::spec::protocol::BuildScope {
        let mut head_dims: Vec<u32> = dims.into_iter().collect();
        head_dims.sort_unstable();
        head_dims.dedup();
        crate::spec::protocol::BuildScope { head_dims, windows: self.shapes.iter().any(|s| s.window.is_some()) }
    }

    pub(super) fn sync_generation(&mut self) {
        if self.sup.generation() != self.loaded_generation {
            self.loaded.clear();
            self.loaded_generation = self.sup.generation();
        }
    }

    /// The diagnosis of every shape's incumbent (see `crate::strategy::diagnose`).
    pub(super) async fn diagnose(&self) -> anyhow::Result<(Vec<Figures>, Vec<Finding>)> {
        let sdpa = self.ledger.sdpa(&self.run_id).await?;
        // The best attention throughput SDPA showed in this run, on any shape and backend.
        let demonstrated = sdpa
            .iter()
            .filter_map(|row| {
                let shape = self.shapes.iter().find(|s| s.key() == row.shape)?;
                let best_us = row
                    .backends
                    .as_object()?
                    .values()
                    .filter_map(|b| b.get("graph_us").and_then(|t| t.as_f64()))
                    .fold(f64::INFINITY, f64::min);
                best_us.is_finite().then(|| shape.flops() / (best_us * 1e-6) / 1e12)
            })
            .fold(None::<f64>, |m, t| Some(m.map_or(t, |m| m.max(t))));
        let mut figures = Vec::new();
        let mut findings = Vec::new();
        for (key, inc) in &self.incumbents {
            let loaded = self.modules.get(&inc.id).and_then(|m| m.loaded.as_ref());
            let first = inc.plan.launches.first();
            let warps_per_sm = first.zip(loaded).and_then(|(l, ld)| {
                let threads: u32 = l.block.iter().product();
                ld.occupancy
                    .iter()
                    .find(|o| o.kernel == l.kernel && o.block_threads == threads && o.dyn_smem == l.dyn_smem)
                    .map(|o| o.blocks_per_sm * threads / 32)
            });
            let f = Figures {
                shape: key.clone(),
                ctas: first.map_or(0, |l| l.ctas()),
                sm_count: self.device.sm_count,
                flops: inc.plan.shape.flops(),
                median_us: inc.median_us,
                // The functions this shape launches: a module holds one per head dim, and
                // another's spills say nothing about this shape's kernel.
                local_bytes: loaded.map(|l| {
                    l.kernels
                        .iter()
                        .filter(|k| inc.plan.launches.iter().any(|launch| launch.kernel == k.kernel))
                        .map(|k| k.local_bytes)
                        .max()
                        .unwrap_or(0)
                }),
                warps_per_sm,
                demonstrated_tflops: demonstrated,
            };
            findings.extend(diagnose(&f));
            figures.push(f);
        }
        Ok((figures, findings))
    }

    /// After a worker restart, the incumbents' modules are gone: load them again.
    pub(super) async fn ensure_incumbents_loaded(&mut self) -> Result<(), Failure> {
        self.sync_generation();
        let ids: Vec<String> = dedup(self.incumbents.values().map(|i| i.id.clone()));
        for id in ids {
            if self.loaded.contains(&id) {
                continue;
            }
            let Some(m) = self.modules.get(&id).cloned() else { continue };
            let scope = self.build_scope(m.head_dims.iter().copied());
            let loaded = compile::load(&mut self.sup, &id, &m.source, &m.arch, &scope, m.kernels, &m.plans, self.cfg.worker.load_timeout)
                .await
                .map_err(|f| Failure::new(Verdict::Error, format!("reloading incumbent {id}: {}", f.reason)))?;
            if let Some(m) = self.modules.get_mut(&id) {
                m.loaded = Some(loaded);
            }
            self.loaded.push(id);
        }
        Ok(())
    }

    /// Timing cases: the candidate `id` on each plan's shape, next to that shape's incumbent.
    pub(super) fn against_incumbents(&self, id: &str, plans: &[ShapePlan]) -> Vec<TimeCase> {
        plans
            .iter()
            .map(|p| {
                let mut entries = vec![timing::entry(id, p)];
                if let Some(inc) = self.incumbents.get(&p.shape.key()) {
                    entries.push(timing::entry(&inc.id, &inc.plan));
                }
                TimeCase { shape: p.shape, entries }
            })
            .collect()
    }

    /// The candidate becomes the incumbent for the shapes it won; `best` advances.
    pub(super) async fn promote(
        &mut self,
        seq: i64,
        id: &str,
        template: &str,
        params: &Params,
        source: &str,
        commit: git2::Oid,
        won: &[(ShapePlan, f64)],
    ) -> anyhow::Result<Vec<BestRow>> {
        let mut best_rows = Vec::new();
        for (plan, median) in won {
            let key = plan.shape.key();
            let source_path = format!("kernels/{key}.cu");
            if !self.baseline_us.contains_key(&key) {
                self.baseline_us.insert(key.clone(), *median);
            }
            self.incumbents.insert(
                key.clone(),
                Incumbent {
                    seq,
                    id: id.to_string(),
                    template: template.to_string(),
                    params: params.clone(),
                    plan: plan.clone(),
                    median_us: *median,
                    source_path: source_path.clone(),
                },
            );
            best_rows.push(BestRow {
                shape: key.clone(),
                seq,
                median_us: *median,
                baseline_us: self.baseline_us.get(&key).copied(),
                source_path,
                git_commit: None,
            });
        }
        let dispatch = self.dispatch_json();
        let mut files: Vec<(String, String)> = won.iter().map(|(p, _)| (format!("kernels/{}.cu", p.shape.key()), source.to_string())).collect();
        files.push(("kernels/dispatch.json".into(), dispatch));
        let refs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let keys: Vec<String> = won.iter().map(|(p, _)| p.shape.key()).collect();
        crate::failpoint::hit("before-accept");
        let accept = self.ws.accept(commit, &refs, &format!("best: iteration {seq} ({template}) for {}", keys.join(", ")))?;
        for b in &mut best_rows {
            b.git_commit = Some(accept.to_string());
        }
        // Modules no incumbent uses any more can be dropped from the reload set.
        let live: Vec<String> = self.incumbents.values().map(|i| i.id.clone()).collect();
        self.modules.retain(|k, _| live.contains(k));
        Ok(best_rows)
    }

    pub(super) fn dispatch_json(&self) -> String {
        let table: BTreeMap<&String, DispatchEntry> = self
            .incumbents
            .iter()
            .map(|(k, i)| {
                (
                    k,
                    DispatchEntry {
                        iteration: i.seq,
                        template: i.template.clone(),
                        params: i.params.clone(),
                        source: i.source_path.clone(),
                        median_us: i.median_us,
                        n_splits: i.plan.n_splits,
                        launches: i.plan.launches.clone(),
                        tensor_maps: i.plan.tensor_maps.clone(),
                    },
                )
            })
            .collect();
        serde_json::to_string_pretty(&table).unwrap_or_default()
    }

    pub(super) async fn unload_if_unused(&mut self, id: &str) {
        if self.incumbents.values().any(|i| i.id == id) {
            return;
        }
        // Only incumbents are ever reloaded: keeping every candidate's source and plans
        // here grew the daemon by ~40 KB an iteration (the soak: 36 -> 389 MiB in 10,000).
        self.modules.remove(id);
        if !self.loaded.iter().any(|l| l == id) || !self.sup.is_running() {
            return;
        }
        self.loaded.retain(|l| l != id);
        let _ = self.sup.request(&crate::spec::protocol::Request::Unload { id: id.to_string() }, Duration::from_secs(30)).await;
    }
}
