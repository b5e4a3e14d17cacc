//! Hopper templates on the CPU: `arch_specific` and `[[tensor_map]]` in a spec, the
//! tensor-map geometry convention, the NVRTC target per device, and the gate's checks.

mod common;

use std::path::PathBuf;

use optimizerd::pipeline::gate;
use optimizerd::spec::protocol::{DType, DeviceInfo, Layout, Shape, ShapePlan, TensorMap, TensorName, ViewStrides};
use optimizerd::strategy::search::{Search, SearchKind};
use optimizerd::spec::template::{Params, Template};

fn templates_dir() -> PathBuf {
    common::repo_root().join("kernel-templates")
}

fn shape(b: u32, h: u32, s: u32, d: u32) -> Shape {
    Shape::mha(b, h, s, d, false, DType::Fp16)
}

fn with(t: &Template, pairs: &[(&str, i64)]) -> Params {
    let mut p = t.default_params();
    for (k, v) in pairs {
        p.insert(k.to_string(), *v);
    }
    p
}

/// A Hopper-style spec; `extra` lands inside `[template]`, `maps` at the end.
fn spec(extra: &str, maps: &str) -> String {
    format!(
        r#"
/* optimizerd:spec
[template]
name = "hopper-synthetic"
min_cc = 90
{extra}
[knobs]
BLOCK_N = [128, 64, 512]
[[launch]]
kernel = "fwd"
grid = ["cdiv(SQ, 128)", "B * HQ", "1"]
block = ["384", "1", "1"]
smem = "1024"
[[launch]]
kernel = "combine"
grid = ["1", "1", "1"]
block = ["32", "1", "1"]
smem = "0"
{maps}
*/
"#
    )
}

const MAPS: &str = r#"
[[tensor_map]]
tensor = "q"
box_rows = 64
swizzle = 128

[[tensor_map]]
tensor = "k"
box_rows = "BLOCK_N"
swizzle = 128

[[tensor_map]]
tensor = "v"
box_rows = "BLOCK_N // 2"
swizzle = 64
"#;

fn hopper() -> Template {
    Template::parse("hopper.cu", spec("arch_specific = true", MAPS)).unwrap()
}

fn parse_err(extra: &str, maps: &str) -> String {
    Template::parse("bad.cu", spec(extra, maps)).unwrap_err().to_string()
}

fn device(major: u32, minor: u32) -> DeviceInfo {
    DeviceInfo { cc_major: major, cc_minor: minor, arch: format!("sm_{major}{minor}"), ..common::h100() }
}

// ---------------------------------------------------------------------------------------
// Spec parsing

#[test]
fn a_spec_declares_arch_specific_and_tensor_maps_in_parameter_order() {
    let t = hopper();
    assert!(t.meta.arch_specific);
    let maps: Vec<(TensorName, &str, &str)> = t.tensor_maps.iter().map(|m| (m.tensor, m.box_rows.as_str(), m.swizzle.as_str())).collect();
    assert_eq!(
        maps,
        vec![(TensorName::Q, "64", "128"), (TensorName::K, "BLOCK_N", "128"), (TensorName::V, "BLOCK_N // 2", "64")],
        "an integer box_rows or swizzle is read as the formula \"64\""
    );
    // The defaults: neither, for every template so far.
    let plain = Template::parse("plain.cu", spec("", "")).unwrap();
    assert!(!plain.meta.arch_specific && plain.tensor_maps.is_empty());
    let base = Template::load(&templates_dir(), "baseline.cu").unwrap();
    assert!(!base.meta.arch_specific && base.tensor_maps.is_empty());
}

#[test]
fn bad_tensor_maps_are_rejected_naming_the_file_the_line_and_the_key() {
    let err = parse_err("", "[[tensor_map]]\ntensor = \"k\"\nbox_row = \"64\"\nswizzle = 128\n");
    assert!(err.contains("bad.cu") && err.contains("box_row") && err.contains("box_rows") && err.contains("line 21"), "{err}");
    let err = parse_err("", "[[tensor_map]]\ntensor = \"x\"\nbox_rows = \"64\"\nswizzle = 128\n");
    assert!(err.contains("bad.cu") && err.contains("`x`") && err.contains("`q`, `k`, `v`, `o`"), "{err}");
    let err = parse_err("", "[[tensor_map]]\ntensor = \"k\"\nbox_rows = \"64\"\nswizzle = 96\n");
    assert!(err.contains("bad.cu") && err.contains("tensor_map[0] (k)") && err.contains("swizzle = 96") && err.contains("32, 64, 128"), "{err}");
    let err = parse_err("", "[[tensor_map]]\ntensor = \"k\"\nswizzle = 128\n");
    assert!(err.contains("box_rows"), "{err}");
    let err = parse_err("", "[[tensor_map]]\ntensor = \"k\"\nbox_rows = [64]\nswizzle = 128\n");
    assert!(err.contains("box_rows") || err.contains("formula"), "{err}");
    // Unknown keys of [template] stay errors.
    let err = parse_err("arch_specfic = true", "");
    assert!(err.contains("arch_specfic") && err.contains("arch_specific"), "{err}");
}

#[test]
fn tensor_maps_need_hopper_and_arch_specific_needs_its_cc() {
    let text = spec("", MAPS).replace("min_cc = 90", "min_cc = 80");
    let err = Template::parse("old.cu", text).unwrap_err().to_string();
    assert!(err.contains("old.cu") && err.contains("[[tensor_map]]") && err.contains("min_cc = 90"), "{err}");
    let text = spec("arch_specific = true", "").replace("min_cc = 90", "");
    let err = Template::parse("nocc.cu", text).unwrap_err().to_string();
    assert!(err.contains("nocc.cu") && err.contains("arch_specific") && err.contains("min_cc"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Geometry: one function, used by the gate, the worker and the export

/// The contiguous [B,H,S,D] view of a shape.
fn c(sh: &Shape) -> ViewStrides {
    ViewStrides::contiguous(sh)
}

#[test]
fn geometry_at_d64_and_d128_follows_the_convention() {
    let k = |box_rows, swizzle| TensorMap { tensor: TensorName::K, box_rows, swizzle, box_panels: None };
    // D 64, 128-byte swizzle: one 64-element panel.
    let sh = shape(2, 8, 512, 64);
    let g = k(128, 128).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!(g.panel, 64);
    assert_eq!(g.dims, [64, 512, 1, 8, 2]);
    assert_eq!(g.strides_bytes, [128, 128, 512 * 64 * 2, 8 * 512 * 64 * 2]);
    assert_eq!(g.box_dims, [64, 128, 1, 1, 1]);
    assert_eq!(g.element_strides, [1, 1, 1, 1, 1]);
    assert_eq!(g.box_bytes(), 128 * 64 * 2);
    // D 128: two panels, each row of a panel 128 bytes apart from the next panel's.
    let sh = shape(4, 16, 4096, 128);
    let g = k(64, 128).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!(g.dims, [64, 4096, 2, 16, 4]);
    assert_eq!(g.strides_bytes, [256, 128, 4096 * 128 * 2, 16 * 4096 * 128 * 2]);
    assert_eq!(g.box_dims, [64, 64, 2, 1, 1]);
    assert_eq!(g.box_bytes(), 64 * 128 * 2);
    // Smaller swizzles: narrower panels.
    let sh = shape(1, 2, 100, 128);
    let g = k(32, 64).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!((g.dims, g.strides_bytes, g.box_dims), ([32, 100, 4, 2, 1], [256, 64, 100 * 256, 2 * 100 * 256], [32, 32, 4, 1, 1]));
    let sh = shape(1, 1, 17, 64);
    let g = k(16, 32).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!((g.dims, g.strides_bytes, g.box_dims), ([16, 17, 4, 1, 1], [128, 32, 17 * 128, 17 * 128], [16, 16, 4, 1, 1]));
}

/// GQA and decode: K and V maps take HKV heads of SK rows, Q and O HQ of SQ; [B,S,H,D]
/// puts the heads D apart and the rows H*D apart; a padded view only widens the strides.
#[test]
fn geometry_follows_heads_rows_and_layout_of_each_tensor() {
    let map = |tensor| TensorMap { tensor, box_rows: 64, swizzle: 128, box_panels: None };
    let mut sh = Shape { b: 2, hq: 32, hkv: 8, sq: 1, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd };
    let g = map(TensorName::K).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!(g.dims, [64, 4096, 2, 8, 2]);
    assert_eq!(g.strides_bytes, [256, 128, 4096 * 256, 8 * 4096 * 256]);
    let g = map(TensorName::Q).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!(g.dims, [64, 1, 2, 32, 2]);
    sh.layout = Layout::Bshd;
    let g = map(TensorName::V).geometry(&sh, &c(&sh)).unwrap();
    assert_eq!(g.strides_bytes, [8 * 256, 128, 256, 4096 * 8 * 256]);
    let g = map(TensorName::V).geometry(&sh, &ViewStrides::padded(&sh)).unwrap();
    assert_eq!(g.strides_bytes, [(8 * 128 + 64) * 2, 128, 256, 4096 * (8 * 128 + 64) * 2]);
    assert!(g.strides_bytes.iter().all(|s| s % 16 == 0), "padded views stay TMA-encodable");
}

#[test]
fn geometry_refuses_what_the_tma_cannot_encode() {
    let k = |box_rows, swizzle| TensorMap { tensor: TensorName::K, box_rows, swizzle, box_panels: None };
    let geo = |m: TensorMap, sh: Shape| m.geometry(&sh, &c(&sh));
    let err = geo(k(64, 128), shape(1, 1, 64, 96)).unwrap_err();
    assert!(err.contains("D = 96") && err.contains("D % 64"), "{err}");
    assert!(geo(k(64, 64), shape(1, 1, 64, 96)).is_ok(), "96 = 3 panels of 32");
    let err = geo(k(0, 128), shape(1, 1, 64, 64)).unwrap_err();
    assert!(err.contains("box_rows = 0") && err.contains("1..=256"), "{err}");
    let err = geo(k(257, 128), shape(1, 1, 64, 64)).unwrap_err();
    assert!(err.contains("box_rows = 257"), "{err}");
    let err = geo(k(64, 16), shape(1, 1, 64, 64)).unwrap_err();
    assert!(err.contains("swizzle = 16"), "{err}");
    let err = geo(k(64, 32), shape(1, 1, 64, 16 * 512)).unwrap_err();
    assert!(err.contains("512 panels") && err.contains("256"), "{err}");
    // A box of fewer panels than D holds (one panel per load): 1..=D/P.
    let panels = |n| TensorMap { box_panels: Some(n), ..k(16, 128) };
    let g = geo(panels(1), shape(1, 1, 64, 128)).unwrap();
    assert_eq!((g.box_dims, g.box_bytes()), ([64, 16, 1, 1, 1], 16 * 128));
    assert_eq!(geo(k(16, 128), shape(1, 1, 64, 128)).unwrap().box_dims, [64, 16, 2, 1, 1]);
    for n in [0, 3] {
        let err = geo(panels(n), shape(1, 1, 64, 128)).unwrap_err();
        assert!(err.contains(&format!("box_panels = {n}")) && err.contains("1..=2"), "{err}");
    }
}

// ---------------------------------------------------------------------------------------
// Plans, targets and the gate

#[test]
fn plans_resolve_box_rows_per_shape_for_every_launch() {
    let t = hopper();
    let plan = t.plan(&with(&t, &[("BLOCK_N", 64)]), &shape(1, 2, 256, 128), &common::h100()).unwrap();
    assert_eq!(plan.launches.len(), 2, "the maps go with every launch; the plan lists them once");
    assert_eq!(
        plan.tensor_maps,
        vec![
            TensorMap { tensor: TensorName::Q, box_rows: 64, swizzle: 128, box_panels: None },
            TensorMap { tensor: TensorName::K, box_rows: 64, swizzle: 128, box_panels: None },
            TensorMap { tensor: TensorName::V, box_rows: 32, swizzle: 64, box_panels: None },
        ]
    );
    // A formula naming no knob says which map it belongs to.
    let t = Template::parse("typo.cu", spec("", &MAPS.replace("\"BLOCK_N\"", "\"BLOCKN\""))).unwrap();
    let err = t.plan(&t.default_params(), &shape(1, 1, 64, 64), &common::h100()).unwrap_err().to_string();
    assert!(err.contains("tensor_map[1].box_rows") && err.contains("BLOCKN"), "{err}");
}

#[test]
fn shape_plans_stay_compatible_with_older_json() {
    let old = r#"{"shape":{"b":1,"h":1,"s":64,"d":64,"causal":false,"dtype":"fp16"},"n_splits":1,
                  "launches":[{"kernel":"optd_fwd_d64","grid":[1,1,1],"block":[128,1,1],"dyn_smem":0}]}"#;
    let p: ShapePlan = serde_json::from_str(old).unwrap();
    assert!(p.tensor_maps.is_empty());
    let json = serde_json::to_value(&p).unwrap();
    assert!(json.get("tensor_maps").is_none(), "plans without maps serialize as before: {json}");
    let t = hopper();
    let with_maps = t.plan(&t.default_params(), &shape(1, 1, 64, 64), &common::h100()).unwrap();
    let json = serde_json::to_value(&with_maps).unwrap();
    assert_eq!(json["tensor_maps"][1], serde_json::json!({"tensor": "k", "box_rows": 128, "swizzle": 128}));
    assert_eq!(serde_json::from_value::<ShapePlan>(json).unwrap(), with_maps);
}

#[test]
fn arch_specific_templates_target_sm_90a_on_exactly_cc_90() {
    let t = hopper();
    assert_eq!(t.meta.target_arch(&common::h100()).unwrap(), "sm_90a");
    let plain = Template::load(&templates_dir(), "mma_fa2.cu").unwrap();
    assert_eq!(plain.meta.target_arch(&common::h100()).unwrap(), "sm_90");
    assert_eq!(plain.meta.target_arch(&common::l4()).unwrap(), "sm_89");
    let err = t.meta.target_arch(&common::l4()).unwrap_err();
    assert!(err.contains("hopper-synthetic needs sm_90a (compute capability 9.0); this GPU is sm_89"), "{err}");
    // A newer GPU cannot run an sm_90a cubin either.
    let err = t.meta.target_arch(&device(10, 0)).unwrap_err();
    assert!(err.contains("needs sm_90a") && err.contains("sm_100"), "{err}");
    // Below min_cc, arch-specific or not.
    let plain_hopper = Template::parse("p.cu", spec("", "")).unwrap();
    let err = plain_hopper.meta.target_arch(&common::l4()).unwrap_err();
    assert!(err.contains("needs compute capability 90") && err.contains("89"), "{err}");
    assert_eq!(plain_hopper.meta.target_arch(&device(10, 0)).unwrap(), "sm_100");
}

#[test]
fn the_gate_refuses_an_arch_specific_template_on_another_gpu() {
    let t = hopper();
    let err = gate::check(&t, &t.default_params(), &[shape(1, 1, 128, 64)], &common::l4(), "1").unwrap_err();
    assert!(err.0.contains("needs sm_90a") && err.0.contains("sm_89"), "{}", err.0);
    assert!(gate::check(&t, &t.default_params(), &[shape(1, 1, 128, 64)], &common::h100(), "1").is_ok());
}

#[test]
fn the_gate_names_the_template_the_map_and_the_fix() {
    let t = hopper();
    // BLOCK_N 512: a box of 512 rows is past the TMA's 256.
    let err = gate::check(&t, &with(&t, &[("BLOCK_N", 512)]), &[shape(1, 1, 1024, 64)], &common::h100(), "1").unwrap_err();
    for want in ["b1h1s1024d64", "hopper-synthetic", "tensor_map[1] (k", "box_rows \"BLOCK_N\" = 512", "1..=256", "fix:"] {
        assert!(err.0.contains(want), "missing {want:?}: {}", err.0);
    }
    // D 96 (a head dim the template lists here): not whole 64-element panels for the
    // 128-byte swizzle of q.
    let t = Template::parse("hopper.cu", spec("arch_specific = true\nhead_dims = [64, 96, 128]", MAPS)).unwrap();
    let err = gate::check(&t, &t.default_params(), &[shape(1, 1, 64, 96)], &common::h100(), "1").unwrap_err();
    for want in ["b1h1s64d96", "hopper-synthetic", "tensor_map[0] (q", "D = 96", "D % 64"] {
        assert!(err.0.contains(want), "missing {want:?}: {}", err.0);
    }
}

/// A swizzle may be a formula of D: wgmma_tma.cu's maps take 64 bytes at D 96 (three panels
/// of 32 columns; no multiple of a 128-byte swizzle's 64) and 128 elsewhere. A formula that
/// gives a width the TMA has not is refused by the gate, naming the map and the value.
#[test]
fn a_swizzle_formula_is_resolved_per_head_dim() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let dev = common::h100();
    for (d, swizzle, panels) in [(64, 128, 1), (96, 64, 3), (128, 128, 2), (256, 128, 4)] {
        let sh = shape(1, 2, 1000, d);
        let plan = t.plan(&t.default_params(), &sh, &dev).unwrap();
        for m in &plan.tensor_maps {
            assert_eq!(m.swizzle, swizzle, "D {d} {:?}", m.tensor);
            let g = m.geometry(&sh, &c(&sh)).unwrap();
            assert_eq!((g.dims[0], g.dims[2], g.box_dims[2]), (swizzle as u64 / 2, panels, panels as u32), "D {d} {:?}", m.tensor);
        }
    }
    let bad = MAPS.replacen("swizzle = 128", "swizzle = \"48 if D == 96 else 128\"", 1);
    let t = Template::parse("hopper.cu", spec("arch_specific = true\nhead_dims = [64, 96]", &bad)).unwrap();
    assert!(gate::check(&t, &t.default_params(), &[shape(1, 1, 64, 64)], &common::h100(), "1").is_ok());
    let err = gate::check(&t, &t.default_params(), &[shape(1, 1, 64, 96)], &common::h100(), "1").unwrap_err();
    for want in ["tensor_map[0] (q", "swizzle 48", "allowed: 32, 64, 128", "fix:"] {
        assert!(err.0.contains(want), "missing {want:?}: {}", err.0);
    }
    // A literal is checked when the template is read.
    let err = parse_err("arch_specific = true", &MAPS.replacen("swizzle = 128", "swizzle = 48", 1));
    assert!(err.contains("swizzle = 48 is not allowed"), "{err}");
}

/// The knob points that decide a template's tensor maps: every combination of the knobs its
/// map formulas read (directly or through derived values), the others at their defaults, then
/// every 97th point of the whole product besides. Planning all ~80k of wgmma_tma.cu's points
/// at every head dim took CI a quarter of an hour for nothing more.
fn map_points(t: &Template) -> Vec<Params> {
    let formulas: Vec<&str> = t
        .tensor_maps
        .iter()
        .flat_map(|m| [Some(&m.box_rows), m.box_panels.as_ref(), Some(&m.swizzle)].into_iter().flatten().map(String::as_str))
        .collect();
    let read = t.knobs_read(&formulas);
    let decides: Vec<(String, Vec<i64>)> = t.knobs.iter().filter(|(k, _)| read.contains(k)).cloned().collect();
    let mut points = Vec::new();
    let mut s = Search::new(SearchKind::Exhaustive, decides, Params::new(), 100_000);
    while let Some(p) = s.next() {
        let mut q = t.default_params();
        q.extend(p);
        points.push(q);
    }
    let mut s = Search::new(SearchKind::Exhaustive, t.knobs.clone(), t.default_params(), 100_000);
    let mut i = 0;
    while let Some(p) = s.next() {
        if i % 97 == 0 {
            points.push(p);
        }
        i += 1;
    }
    points
}

/// Every shipped template with tensor maps (wgmma_tma.cu, the probe) gives encodable
/// maps for every point that decides them (`map_points`) at every head dim it lists, on the
/// device it targets.
#[test]
fn shipped_tensor_maps_are_encodable_for_every_knob_combination() {
    let mut files = Vec::new();
    for sub in ["", "testing"] {
        for e in std::fs::read_dir(templates_dir().join(sub)).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "cu") {
                files.push(path.strip_prefix(templates_dir()).unwrap().display().to_string());
            }
        }
    }
    let mut with_maps = 0;
    for file in files {
        let t = Template::load(&templates_dir(), &file).unwrap_or_else(|e| panic!("{e}"));
        if t.tensor_maps.is_empty() {
            continue;
        }
        with_maps += 1;
        assert!(t.meta.min_cc >= 90, "{file}");
        let dev = common::h100();
        assert!(t.meta.target_arch(&dev).is_ok(), "{file} must target the H100");
        for p in map_points(&t) {
            // Every head dim the template lists (wgmma_tma.cu's maps swizzle 64 bytes at D 96).
            let shapes = t.meta.head_dims.iter().flat_map(|&d| [shape(1, 1, 1, d), shape(2, 16, 4097, d)]);
            for sh in shapes.chain([shape(1, 2, 200, 64)]) {
                let plan = match t.plan(&p, &sh, &dev) {
                    Ok(plan) => plan,
                    Err(optimizerd::spec::template::TemplateError::Refused { .. }) => continue, // [[refuse]]: never planned
                    Err(e) => panic!("{file} {p:?}: {e}"),
                };
                assert_eq!(plan.tensor_maps.len(), t.tensor_maps.len());
                for (i, m) in plan.tensor_maps.iter().enumerate() {
                    m.geometry(&sh, &c(&sh)).unwrap_or_else(|e| panic!("{file} {p:?} {} tensor_map[{i}]: {e}", sh.key()));
                }
            }
        }
    }
    assert!(with_maps >= 1, "the probe template at least declares a tensor map");
}

/// wgmma_tma.cu's PACK_GQA: the query heads of a K/V head share a work tile only with
/// G = HQ / HKV in {2, 4, 8} (whole 8-row boxes of a panel); there the Q and O boxes shrink to
/// 64 / G rows of one 64-column panel each (D 128: the kernel loads a box per panel) and the
/// grid walks B x HKV heads over SQ / (64 CONSUMERS / G) tiles. Everywhere else the knob changes
/// nothing: the plan equals PACK_GQA 0's.
#[test]
fn pack_gqa_packs_a_kv_heads_query_heads_only_where_its_boxes_fit() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let dev = common::h100();
    // OVERLAP 0: 3 consumers with OVERLAP at D 128 are refused (the wgmma serialized).
    let knobs = |pack: i64| with(&t, &[("PACK_GQA", pack), ("CONSUMERS", 3), ("PERSISTENT", 0), ("BLOCK_N", 128), ("OVERLAP", 0)]);
    let gqa = |hq: u32, hkv: u32, s: u32, d: u32| Shape { b: 4, hq, hkv, sq: s, sk: s, d, causal: true, window: None, dtype: DType::Bf16, layout: Layout::Bhsd };
    let map = |plan: &ShapePlan, name: TensorName| *plan.tensor_maps.iter().find(|m| m.tensor == name).unwrap();
    let rows = |plan: &ShapePlan, name: TensorName| map(plan, name).box_rows;

    for (hq, hkv, d, box_rows) in [(16, 4, 64, 16), (32, 4, 64, 8), (16, 8, 64, 32), (32, 8, 128, 16), (32, 4, 128, 8)] {
        let sh = gqa(hq, hkv, 2048, d);
        let plan = t.plan(&knobs(1), &sh, &dev).unwrap();
        let g = hq / hkv;
        assert_eq!((rows(&plan, TensorName::Q), rows(&plan, TensorName::O)), (box_rows, box_rows), "{}", sh.key());
        assert_eq!(rows(&plan, TensorName::K), 128, "{}", sh.key());
        // One panel per Q / O box; K and V boxes span D.
        assert_eq!((map(&plan, TensorName::Q).box_panels, map(&plan, TensorName::O).box_panels), (Some(1), Some(1)), "{}", sh.key());
        assert_eq!(map(&plan, TensorName::V).box_panels, None, "{}", sh.key());
        let q = map(&plan, TensorName::Q).geometry(&sh, &ViewStrides::contiguous(&sh)).unwrap();
        assert_eq!(q.box_dims, [64, box_rows, 1, 1, 1], "{}", sh.key());
        // 192 / G query positions per work tile, B x HKV packed heads
        assert_eq!(plan.launches[0].grid, [2048u32.div_ceil(192 / g), 4 * hkv, 1], "{}", sh.key());
    }
    // G 1 or 32 (64 / G not whole 8-row atoms): unchanged
    for sh in [gqa(16, 16, 2048, 64), gqa(32, 1, 2048, 64), gqa(32, 32, 2048, 128)] {
        let (packed, plain) = (t.plan(&knobs(1), &sh, &dev).unwrap(), t.plan(&knobs(0), &sh, &dev).unwrap());
        assert_eq!(packed, plain, "{}", sh.key());
        assert_eq!(rows(&plain, TensorName::Q), 64, "{}", sh.key());
        assert_eq!(map(&plain, TensorName::Q).box_panels, Some(sh.d / 64), "{}", sh.key());
        assert_eq!(plain.launches[0].grid, [2048u32.div_ceil(192), 4 * sh.hq, 1], "{}", sh.key());
    }
}

/// wgmma_tma.cu's STREAM_K: where the kernel may cut the last round's tiles into key-range
/// pieces (persistent; a tail of at least one key tile per SM; causal only when every tile is
/// in one partial round), the plan's splits size o_partial for two pieces per CTA ((4 + D / 2)
/// x 128 floats per consumer each: the kernel's room check), the grid is every SM (also with
/// fewer tiles than SMs) and the tensor maps stay; elsewhere the plan equals STREAM_K 0's.
#[test]
fn stream_k_sizes_its_scratch_and_changes_nothing_else() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let dev = common::h100();
    let sms = dev.sm_count;
    let knobs = |sk: i64, persistent: i64, consumers: i64| {
        // OVERLAP 0: 3 consumers with OVERLAP at D 128 are refused (the wgmma serialized).
        with(&t, &[("STREAM_K", sk), ("PERSISTENT", persistent), ("CONSUMERS", consumers), ("BLOCK_N", 128), ("OVERLAP", 0)])
    };
    let gqa = |b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, d: u32, causal: bool| Shape { b, hq, hkv, sq, sk, d, causal, window: None, dtype: DType::Fp16, layout: Layout::Bhsd };
    let mha = |b: u32, h: u32, s: u32, d: u32, causal: bool| gqa(b, h, h, s, s, d, causal);
    // (shape, consumers, work tiles): more tiles than SMs (a tail of 56 and 68), fewer (128
    // 128-row tiles: 8 key tiles each, and chunked prefill's 29-32, causal).
    for (sh, consumers, tiles) in [
        (mha(2, 16, 8192, 128, false), 3, 1376),
        (mha(4, 16, 4096, 64, false), 2, 2048),
        (mha(1, 16, 1024, 128, false), 2, 128),
        (gqa(1, 32, 8, 512, 4096, 128, true), 2, 128),
    ] {
        let (sk, plain) = (t.plan(&knobs(1, 1, consumers), &sh, &dev).unwrap(), t.plan(&knobs(0, 1, consumers), &sh, &dev).unwrap());
        let rows = u64::from(sh.b) * u64::from(sh.hq) * u64::from(sh.sq);
        let need = 2 * u64::from(sms) * consumers as u64 * 128 * (4 + u64::from(sh.d) / 2);
        let have = u64::from(sk.n_splits) * rows * u64::from(sh.d);
        assert!(have >= need, "{}: {} splits hold {have} floats, the pieces need {need}", sh.key(), sk.n_splits);
        assert!(u64::from(sk.n_splits - 1) * rows * u64::from(sh.d) < need, "{}: {} splits, more than the pieces need", sh.key(), sk.n_splits);
        assert_eq!(sk.tensor_maps, plain.tensor_maps, "{}", sh.key());
        assert_eq!(sk.launches[0].grid, [sms, 1, 1], "{}", sh.key());
        assert_eq!(plain.launches[0].grid, [tiles.min(sms), 1, 1], "{}", sh.key());
        assert_eq!(plain.n_splits, 1);
    }
    // Large shapes need no more than O's own size of scratch.
    assert_eq!(t.plan(&knobs(1, 1, 3), &mha(2, 16, 8192, 128, false), &dev).unwrap().n_splits, 1);
    // Causal rounds (DYNAMIC balances those), one CTA per tile, a tail of fewer key tiles
    // than SMs (2 tiles of 2 key tiles): whole tiles, STREAM_K 0's plan.
    for (sh, persistent, consumers) in [(mha(2, 16, 8192, 128, true), 1, 3), (mha(2, 16, 8192, 128, false), 0, 3), (mha(1, 2, 200, 64, false), 1, 3)] {
        assert_eq!(t.plan(&knobs(1, persistent, consumers), &sh, &dev).unwrap(), t.plan(&knobs(0, persistent, consumers), &sh, &dev).unwrap(), "{}", sh.key());
    }
}

/// A map's `box_panels` is optional on the wire: plans stored before it existed (no key) read
/// as "every panel", and a map without it serializes as before.
#[test]
fn tensor_maps_without_box_panels_read_and_write_as_before() {
    let old: TensorMap = serde_json::from_str(r#"{"tensor":"q","box_rows":64,"swizzle":128}"#).unwrap();
    assert_eq!(old, TensorMap { tensor: TensorName::Q, box_rows: 64, swizzle: 128, box_panels: None });
    assert_eq!(serde_json::to_string(&old).unwrap(), r#"{"tensor":"q","box_rows":64,"swizzle":128}"#);
    let one = TensorMap { box_panels: Some(1), ..old };
    assert_eq!(serde_json::from_str::<TensorMap>(&serde_json::to_string(&one).unwrap()).unwrap(), one);
    let sh = shape(1, 1, 64, 128);
    assert_eq!(old.geometry(&sh, &c(&sh)).unwrap().box_dims, [64, 64, 2, 1, 1]);
}

/// wgmma_tma.cu's `[inert]` lines: PACK_GQA where nothing packs, TAIL_SPLIT where no work tile
/// has at most 64 query rows, STREAM_K where the kernel would run whole tiles anyway. The
/// searches then try one value there (Template::canonical resets it to the first).
#[test]
fn wgmma_tma_declares_which_knobs_change_nothing_on_a_shape() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let dev = common::h100();
    let p = with(&t, &[("PACK_GQA", 1), ("TAIL_SPLIT", 0), ("STREAM_K", 1), ("LPT_MIB", 32), ("CONSUMERS", 3), ("PERSISTENT", 1), ("BLOCK_N", 128)]);
    let sh = |b: u32, hq: u32, hkv: u32, s: u32, d: u32, causal: bool| Shape { b, hq, hkv, sq: s, sk: s, d, causal, window: None, dtype: DType::Fp16, layout: Layout::Bhsd };
    let kept = |shapes: &[Shape]| {
        let c = t.canonical(&p, shapes, &dev).unwrap();
        ["PACK_GQA", "TAIL_SPLIT", "STREAM_K", "LPT_MIB"].map(|k| c[k] == p[k])
    };
    // (2,16,8192,128): MHA, last tile 128 rows of 192, 1376 tiles on 132 SMs (a tail of 56).
    // LPT_MIB: not causal, so the longest-first groups play no part.
    assert_eq!(kept(&[sh(2, 16, 16, 8192, 128, false)]), [false, false, true, false]);
    // (4,16,4096,64) causal: last tile 64 rows (split), causal (whole tiles); persistent with
    // DYNAMIC (the default) takes its tiles in LPT_MIB's groups.
    assert_eq!(kept(&[sh(4, 16, 16, 4096, 64, true)]), [false, true, false, true]);
    // GQA 4 packs (then no split tiles); one tile per head fills no SM: no tail.
    assert_eq!(kept(&[sh(1, 8, 2, 128, 64, false)]), [true, false, false, false]);
    // A class holding both: every knob matters on one of them.
    assert_eq!(kept(&[sh(2, 16, 16, 8192, 128, false), sh(4, 16, 16, 4096, 64, true), sh(1, 8, 2, 128, 64, false)]), [true, true, true, true]);
    // One CTA per tile, causal: the groups matter.
    let grid = with(&t, &[("LPT_MIB", 32), ("PERSISTENT", 0)]);
    assert_eq!(t.canonical(&grid, &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap()["LPT_MIB"], 32);
    assert_eq!(t.canonical(&grid, &[sh(4, 16, 16, 4096, 64, false)], &dev).unwrap()["LPT_MIB"], 8);
    // DYNAMIC: persistent causal grids take tiles from the counter, longest first in LPT_MIB's
    // groups (which then matter); one CTA per tile, or not causal, it changes nothing.
    // (The first value, the one canonical points carry, is 1; the static rounds are DYNAMIC 0.)
    let dynamic = with(&t, &[("DYNAMIC", 1), ("LPT_MIB", 32), ("PERSISTENT", 1)]);
    let c = t.canonical(&dynamic, &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap();
    assert_eq!((c["DYNAMIC"], c["LPT_MIB"]), (1, 32));
    let c = t.canonical(&dynamic, &[sh(4, 16, 16, 4096, 64, false)], &dev).unwrap();
    assert_eq!((c["DYNAMIC"], c["LPT_MIB"]), (1, 8));
    let static_rounds = with(&t, &[("DYNAMIC", 0), ("LPT_MIB", 32), ("PERSISTENT", 1)]);
    let c = t.canonical(&static_rounds, &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap();
    assert_eq!((c["DYNAMIC"], c["LPT_MIB"]), (0, 8));
    let c = t.canonical(&with(&t, &[("DYNAMIC", 0), ("PERSISTENT", 0)]), &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap();
    assert_eq!(c["DYNAMIC"], 1);
    // Q_STAGES: a second Q slot matters only where a CTA runs several work tiles.
    let two_q = with(&t, &[("Q_STAGES", 2), ("PERSISTENT", 1)]);
    assert_eq!(t.canonical(&two_q, &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap()["Q_STAGES"], 2);
    let two_q_grid = with(&t, &[("Q_STAGES", 2), ("PERSISTENT", 0)]);
    assert_eq!(t.canonical(&two_q_grid, &[sh(4, 16, 16, 4096, 64, true)], &dev).unwrap()["Q_STAGES"], 1);
    // PV_WAIT: where the OVERLAP loop waits for the previous P V; without OVERLAP there is none.
    // (The first value, the one canonical points carry, is 1: after the row max.)
    let late = with(&t, &[("PV_WAIT", 0), ("OVERLAP", 1)]);
    assert_eq!(t.canonical(&late, &[sh(4, 16, 16, 4096, 64, false)], &dev).unwrap()["PV_WAIT"], 0);
    let no_overlap = with(&t, &[("PV_WAIT", 0), ("OVERLAP", 0)]);
    assert_eq!(t.canonical(&no_overlap, &[sh(4, 16, 16, 4096, 64, false)], &dev).unwrap()["PV_WAIT"], 1);
    // LAZY_RESCALE: the D 64 OVERLAP loop with PV_WAIT rescales O every key tile (no threshold
    // there, Consumer::kLazy); at D 128 that loop skips the rescale by a warp-uniform branch, and
    // with PV_WAIT 0, or without OVERLAP, the threshold skips rescales at either D: it matters.
    let eager = |overlap: i64, pv_wait: i64| with(&t, &[("LAZY_RESCALE", 0), ("OVERLAP", overlap), ("PV_WAIT", pv_wait)]);
    let lazy_at = |k: &Params, d: u32| t.canonical(k, &[sh(4, 16, 16, 4096, d, false)], &dev).unwrap()["LAZY_RESCALE"];
    assert_eq!((lazy_at(&eager(1, 1), 64), lazy_at(&eager(1, 0), 64), lazy_at(&eager(0, 1), 64)), (1, 0, 0));
    assert_eq!(lazy_at(&eager(1, 1), 128), 0, "the D 128 loop skips rescales");
    // STREAM_K, causal: only a grid of one partial round (chunked prefill: 128 tiles of 29-32
    // key tiles on 132 SMs) may run pieces; causal rounds (the large causal shape) never do.
    let pieces = with(&t, &[("STREAM_K", 1), ("PERSISTENT", 1), ("CONSUMERS", 2), ("BLOCK_N", 128)]);
    let chunked = Shape { b: 1, hq: 32, hkv: 8, sq: 512, sk: 4096, d: 128, causal: true, window: None, dtype: DType::Fp16, layout: Layout::Bhsd };
    assert_eq!(t.canonical(&pieces, &[chunked], &dev).unwrap()["STREAM_K"], 1);
    assert_eq!(t.canonical(&pieces, &[sh(2, 16, 16, 8192, 128, true)], &dev).unwrap()["STREAM_K"], 0);
    // Not with a sliding window: whole tiles (pieces cutting each tile's own key range ran 2x
    // slower on Gemma 3's local chunk, 64 tiles on 132 SMs; docs/HOPPER.md, session 30).
    let local = Shape { window: Some(1024), d: 256, hq: 16, ..chunked };
    let d256 = with(&t, &[("STREAM_K", 1), ("PERSISTENT", 1), ("CONSUMERS", 2), ("BLOCK_N", 64), ("EPI_TMA", 0)]);
    assert_eq!(t.canonical(&d256, &[local], &dev).unwrap()["STREAM_K"], 0);
    // CLUSTER_SPLIT: one cluster of two CTAs per work tile whatever PERSISTENT says, so a search
    // reaches it from a persistent point by turning one knob; PERSISTENT and what only a
    // persistent grid reads (Q_STAGES, DYNAMIC, STREAM_K) are then inert and reset.
    let split = |persistent: i64| with(&t, &[("CLUSTER_SPLIT", 1), ("PERSISTENT", persistent), ("Q_STAGES", 2), ("DYNAMIC", 0), ("STREAM_K", 1), ("CONSUMERS", 2), ("BLOCK_N", 64), ("EPI_TMA", 0)]);
    let (a, b) = (t.canonical(&split(0), &[local], &dev).unwrap(), t.canonical(&split(1), &[local], &dev).unwrap());
    assert_eq!(a, b, "PERSISTENT is inert under CLUSTER_SPLIT");
    assert_eq!((a["CLUSTER_SPLIT"], a["PERSISTENT"], a["Q_STAGES"], a["DYNAMIC"], a["STREAM_K"]), (1, 1, 1, 1, 0));
    // Its grid: twice the query tiles along x (clusters of 2), the heads along y; one Q slot.
    let launch = &t.plan(&b, &local, &dev).unwrap().launches[0];
    assert_eq!((launch.grid, launch.block), ([2 * 4, 16, 1], [384, 1, 1]));
    let whole = with(&t, &[("PERSISTENT", 1), ("CONSUMERS", 2), ("BLOCK_N", 64), ("EPI_TMA", 0)]);
    assert_eq!(t.plan(&whole, &local, &dev).unwrap().launches[0].grid, [64, 1, 1], "persistent: one CTA per SM, 64 tiles");
}
