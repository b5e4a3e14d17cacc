//! What is sent to the model: the rules a template must keep (ABI, spec comment,
//! headers, no persistent state), the reply format, the GPU's facts, the diagnosis of
//! the incumbents (times vs SDPA, TFLOPS vs the demonstrated peak, registers, spills,
//! CTAs, waves, occupancy), a compact history from the ledger, and the incumbent
//! template with its knob values. Deterministic for the same inputs, so its hash
//! identifies it in the ledger.

use sha2::{Digest, Sha256};

use crate::agent::client::Message;
use crate::spec::protocol::DeviceInfo;
use crate::spec::template::Params;

pub struct PromptInput<'a> {
    /// File name of the template being edited (e.g. `mma_fa2.cu`).
    pub template_file: &'a str,
    pub template_text: &'a str,
    pub params: &'a Params,
    pub dtype: &'a str,
    pub device: &'a DeviceInfo,
    /// The shapes this template should get faster on, in words.
    pub target: String,
    /// One line per shape: incumbent time, SDPA, TFLOPS, resources.
    pub diagnosis: Vec<String>,
    /// Recent iterations, one line each, oldest first.
    pub history: Vec<String>,
    pub allowed_headers: &'a [String],
}

pub fn system() -> String {
    "You are a CUDA performance engineer improving a FlashAttention-forward kernel template. \
     Every proposal you make is compiled with NVRTC, checked against an fp32 reference on fresh inputs \
     (before and after timing, at different addresses, on a second stream, with guard regions around O \
     and Q/K/V compared after the run), then timed against the current best kernel. Only a correct \
     kernel that is faster beyond noise is kept. Kernels that skip work, reuse earlier results, write \
     outside O or touch Q/K/V are detected and rejected."
        .into()
}

pub fn rules(allowed_headers: &[String]) -> String {
    format!(
        "Rules for the template (violations are refused before compiling):\n\
         - Keep the `/* optimizerd:spec ... */` comment byte-identical: knobs, launch grid/block/shared memory and tensor maps are fixed.\n\
         - Keep every `extern \"C\"` kernel's name and parameter list (the ABI in common/optd.cuh) and its OPTD_CTA_DONE() call; never use cta_counter otherwise.\n\
         - Knob macros are #defined by the daemon before the template; do not #define or #undef them or any OPTD_ macro.\n\
         - Include only: {}.\n\
         - No mutable global device state (`__device__`/`__managed__` variables), no malloc/new, no child launches: every launch must compute O from Q, K, V alone.\n\
         - Write exactly O (and the o_partial/lse_partial scratch if the template uses splits); never write Q, K or V.\n\
         - lse_partial's last B*HQ*SQ words (from index n_splits*B*HQ*SQ) are split semaphores: zero when the launches start, and they must be zero again when they end (a kernel that counts arrivals resets its counter); the check fails otherwise.\n\
         - Kernel ABI v2: address every row through `strides` (element strides of batch, head and row; only the last dimension is contiguous): the check also runs views whose rows are further apart than D. Query head h reads KV head optd_kv_head(h, heads_q, heads_kv); causal is bottom-right (row i sees keys <= i + seq_k - seq_q).\n\
         Reply format: first a line `SUMMARY: <one line saying what changes and why it should be faster>`, then one or more blocks\n\
         <<<<<<< SEARCH\n<lines copied exactly from the template>\n=======\n<replacement lines>\n>>>>>>> REPLACE\n\
         Each SEARCH must occur exactly once in the template. Alternatively give the whole new template between \
         `<<<<<<< TEMPLATE` and `>>>>>>> TEMPLATE`. Nothing else is applied.",
        allowed_headers.join(", ")
    )
}

pub fn messages(p: &PromptInput<'_>) -> Vec<Message> {
    let d = p.device;
    let mut user = String::new();
    user.push_str(&rules(p.allowed_headers));
    user.push_str(&format!(
        "\n\nGPU: {} (sm_{}{}, {} SMs, {} KiB shared memory per block opt-in, {} KiB per SM, L2 {} MiB, {} threads per SM, driver {}, NVRTC {}.{}).\n",
        d.name,
        d.cc_major,
        d.cc_minor,
        d.sm_count,
        d.smem_optin / 1024,
        d.smem_per_sm / 1024,
        d.l2_bytes / (1 << 20),
        d.max_threads_per_sm,
        d.driver_version,
        d.nvrtc_version.0,
        d.nvrtc_version.1
    ));
    user.push_str(&format!("Element type: {}. Target: {}.\n", p.dtype, p.target));
    user.push_str("\nDiagnosis of the current best kernels (per shape):\n");
    for l in &p.diagnosis {
        user.push_str("- ");
        user.push_str(l);
        user.push('\n');
    }
    if !p.history.is_empty() {
        user.push_str("\nRecent iterations (oldest first):\n");
        for l in &p.history {
            user.push_str("- ");
            user.push_str(l);
            user.push('\n');
        }
    }
    user.push_str(&format!(
        "\nThe template `{}`, used with knob values {}:\n```cuda\n{}\n```\nPropose one edit that makes it faster on the target shapes.",
        p.template_file,
        serde_json::to_string(p.params).unwrap_or_default(),
        p.template_text.trim_end()
    ));
    vec![Message::new("system", system()), Message::new("user", user)]
}

/// sha256 of the request body (model, messages, sampling): the prompt's identity.
pub fn hash(body: &serde_json::Value) -> String {
    Sha256::digest(body.to_string().as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
