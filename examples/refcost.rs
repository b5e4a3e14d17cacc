use optimizerd::spec::protocol::{DType, Shape};
use optimizerd::worker::reference as r;
use std::time::Instant;
fn main() {
    for (b,h,s,d,c) in [(2,16,8192,128,false),(2,16,8192,128,true),(4,16,4096,64,false),(4,16,4096,64,true)] {
        let sh = Shape{b,h,s,d,causal:c,dtype:DType::Fp16};
        let t = Instant::now();
        let (q,k,v) = r::randn_inputs(&sh, 7);
        let t1 = t.elapsed();
        let rows = r::select_rows(&sh, 7);
        let want = r::reference_rows(&sh,&q,&k,&v,&rows);
        let t2 = t.elapsed();
        let bits = [&q,&k,&v].map(|x| r::to_bits(x, sh.dtype));
        let t3 = t.elapsed();
        println!("{} randn {:?} ref {:?} ({} rows) bits {:?} {}", sh.key(), t1, t2-t1, rows.len(), t3-t2, want.len()+bits.len());
    }
}
