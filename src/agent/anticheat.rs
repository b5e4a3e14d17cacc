//! Static refusal of agent templates that could cheat or break the contract, before
//! anything is compiled: the spec comment (knobs, launches, tensor maps) and every
//! exported kernel's name and parameter list must stay as they were; headers only from
//! the allow-list; no mutable global device state that survives a launch (`__device__`
//! or `__managed__` variables), no device heap, no child launches or host-side CUDA
//! calls, no redefinition of the ABI's macros or the knobs, and no new uses of the CTA
//! counter. What a kernel does at run time is the worker's probes' business.

use crate::spec::template::Template;

/// Identifiers an agent template may not use, with why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("malloc", "device heap memory persists across launches"),
    ("free", "device heap memory persists across launches"),
    ("new", "device heap memory persists across launches"),
    ("delete", "device heap memory persists across launches"),
    ("cudaMalloc", "allocation from a kernel"),
    ("cudaLaunchDevice", "child launches escape the timed launch"),
    ("cudaDeviceSynchronize", "child launches escape the timed launch"),
    ("cudaStreamCreateWithFlags", "child launches escape the timed launch"),
    ("cudaGraphLaunch", "child launches escape the timed launch"),
    ("__managed__", "managed memory persists across launches"),
];

/// Every reason `edited` may not replace `base`; Ok when none.
pub fn check(base: &Template, edited: &str, allowed_headers: &[String]) -> Result<(), String> {
    let base_spec = spec_comment(&base.text).ok_or("the base template has no spec comment")?;
    match spec_comment(edited) {
        Some(s) if s == base_spec => {}
        Some(_) => return Err("changes the `optimizerd:spec` comment (knobs, launches, tensor maps are the daemon's contract); keep it byte-identical".into()),
        None => return Err("removes the `optimizerd:spec` comment; keep it byte-identical".into()),
    }
    let code = strip_comments(edited);
    let base_code = strip_comments(&base.text);

    for line in code.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix('#').map(str::trim_start) {
            if let Some(inc) = rest.strip_prefix("include") {
                let inc = inc.trim();
                let name = inc.trim_start_matches(['"', '<']).trim_end_matches(['"', '>']);
                if !allowed_headers.iter().any(|h| h == name) {
                    return Err(format!("includes {inc}, which is not in agent.allowed_headers ({})", allowed_headers.join(", ")));
                }
            }
            if rest.starts_with("undef") {
                return Err(format!("`{}`: #undef may change the ABI's or the knobs' meaning", t.trim()));
            }
            if let Some(def) = rest.strip_prefix("define") {
                let name: String = def.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if name.starts_with("OPTD_") || base.knobs.iter().any(|(k, _)| *k == name) {
                    return Err(format!("redefines {name}, which belongs to the ABI or is a knob set by the daemon"));
                }
            }
        }
    }

    let (base_kernels, kernels) = (exported(&base_code), exported(&code));
    if base_kernels != kernels {
        let names = |k: &[(String, String)]| k.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
        return Err(format!(
            "changes the exported kernels (must stay {} with their parameter lists; found {})",
            names(&base_kernels),
            names(&kernels)
        ));
    }
    if count_token(&code, "OPTD_CTA_DONE") < count_token(&base_code, "OPTD_CTA_DONE") {
        return Err("removes an OPTD_CTA_DONE(): every exported kernel must count its CTAs".into());
    }
    if count_token(&code, "cta_counter") > count_token(&base_code, "cta_counter") {
        return Err("uses cta_counter: only OPTD_CTA_DONE() may touch it".into());
    }
    for (word, why) in FORBIDDEN {
        if count_token(&code, word) > count_token(&base_code, word) {
            return Err(format!("uses `{word}` ({why})"));
        }
    }
    if code.contains("<<<") {
        return Err("launches a kernel from a kernel (`<<<`): child launches escape the timed launch".into());
    }
    if let Some(decl) = mutable_device_globals(&code).into_iter().next() {
        return Err(format!(
            "declares mutable global device state `{decl}`: it persists across launches, so a kernel could reuse an earlier result; \
             use registers/shared memory, or `constexpr`/`__constant__` for tables"
        ));
    }
    Ok(())
}

/// The text of the `/* optimizerd:spec ... */` comment.
fn spec_comment(text: &str) -> Option<&str> {
    let start = text.find("/* optimizerd:spec")?;
    let end = text[start..].find("*/")?;
    Some(&text[start..start + end + 2])
}

/// Comments replaced by spaces (newlines kept, so lines stay lines); string and char
/// literals kept as they are.
pub fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'"' || b[i] == b'\'' {
            let q = b[i];
            let start = i;
            i += 1;
            while i < b.len() && b[i] != q && b[i] != b'\n' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(b.len());
            out.push_str(&text[start..i]);
        } else {
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn count_token(code: &str, word: &str) -> usize {
    code.match_indices(word)
        .filter(|(i, _)| {
            let before = code[..*i].chars().next_back();
            let after = code[i + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .count()
}

/// (name, parameter list) of every `extern "C"` kernel, sorted.
fn exported(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("extern \"C\"") {
        let rest = &code[i..];
        let Some(name_at) = rest.find("optd_") else { continue };
        let name: String = rest[name_at..].chars().take_while(|c| is_ident(*c)).collect();
        let after = &rest[name_at + name.len()..];
        let Some(open) = after.find('(') else { continue };
        let mut depth = 0;
        let mut params = String::new();
        for c in after[open..].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            params.push(c);
            if depth == 0 {
                break;
            }
        }
        out.push((name, params.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    out.sort();
    out
}

/// File-scope variables declared `__device__` (not `constexpr`): state that outlives a launch.
fn mutable_device_globals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // One entry per open brace: true for a namespace (its body is still file scope) or
    // an initializer (`= { ... }`, part of the statement).
    let mut stack: Vec<bool> = Vec::new();
    let mut stmt = String::new();
    let file_scope = |stack: &[bool]| stack.iter().all(|transparent| *transparent);
    for line in code.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        for c in line.chars().chain(std::iter::once('\n')) {
            let at_file = file_scope(&stack);
            match c {
                '{' => {
                    let transparent = at_file && (count_token(&stmt, "namespace") > 0 || stmt.contains('='));
                    if at_file && !stmt.contains('=') {
                        stmt.clear();
                    } else if at_file {
                        stmt.push(c);
                    }
                    stack.push(transparent);
                }
                '}' => {
                    stack.pop();
                    if file_scope(&stack) && !stmt.contains('=') {
                        stmt.clear();
                    }
                }
                ';' if at_file => {
                    let s = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
                    let decl = s.split('=').next().unwrap_or("");
                    if count_token(decl, "__device__") > 0 && !decl.contains('(') && count_token(decl, "constexpr") == 0 {
                        out.push(s);
                    }
                    stmt.clear();
                }
                _ if at_file => stmt.push(c),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Template {
        Template::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/kernel-templates")), "baseline.cu").unwrap()
    }

    fn allowed() -> Vec<String> {
        crate::spec::agent::AgentSection::default().allowed_headers
    }

    #[test]
    fn the_base_itself_passes_and_a_plain_edit_passes() {
        let b = base();
        check(&b, &b.text, &allowed()).unwrap();
        let edited = b.text.replace("exp2f(s - m_new)", "exp2f(s - m_new) * 1.0f");
        check(&b, &edited, &allowed()).unwrap();
    }

    #[test]
    fn each_static_cheat_is_refused() {
        let b = base();
        let cases: Vec<(String, &str)> = vec![
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\n__device__ int calls;"), "mutable global device state"),
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\nstatic __device__ float cache[64] = {0};"), "mutable global device state"),
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\n#include \"../../secrets.h\""), "allowed_headers"),
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\n#include <cstdio>"), "allowed_headers"),
            (b.text.replace("WARPS_PER_CTA = [4]", "WARPS_PER_CTA = [4, 8]"), "spec"),
            (b.text.replace("optd_fwd_d64(OPTD_ARGS)", "optd_fwd_d64(OPTD_ARGS, int extra)"), "exported kernels"),
            (b.text.replacen("OPTD_CTA_DONE();", "", 1), "OPTD_CTA_DONE"),
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\n#undef OPTD_CTA_DONE\n#define OPTD_CTA_DONE() (void)0"), "#undef"),
            (b.text.replace("#include \"common/optd.cuh\"", "#include \"common/optd.cuh\"\n#define WARPS_PER_CTA 8"), "knob"),
            (b.text.replace("float m = OPTD_NEG_INF", "float* scratch = (float*)malloc(64);\n    float m = OPTD_NEG_INF"), "malloc"),
            (b.text.replace("s = warp_sum(s);", "s = warp_sum(s); if (j == 0) atomicAdd(cta_counter, 1u);"), "cta_counter"),
            (b.text.replace("__device__ __forceinline__ void baseline_fwd", "__managed__ int seen;\ntemplate <int X> __device__ __forceinline__ void baseline_fwd"), "__managed__"),
        ];
        for (text, why) in cases {
            let e = check(&b, &text, &allowed()).unwrap_err();
            assert!(e.contains(why), "expected {why:?}: {e}");
        }
    }

    #[test]
    fn comments_and_functions_are_not_globals() {
        let code = strip_comments("// __device__ int x;\n/* __device__ int y; */\n__device__ int f(int a);\n__device__ constexpr int T = 4;\n__device__ int g() { int z; return 0; }\n");
        assert!(mutable_device_globals(&code).is_empty(), "{:?}", mutable_device_globals(&code));
        assert_eq!(mutable_device_globals("__device__ unsigned int hits = 0;\n"), vec!["__device__ unsigned int hits".to_string() + " = 0"]);
    }
}
