//! Fills a database with synthetic runs and serves it: a quick way to try the UI.
//!
//! cargo run -p draftlens-web --example demo -- /tmp/demo.sqlite [small|showcase|bench] [127.0.0.1:8080]

use draftlens_results::store::Store;
use draftlens_web::demo::{fill_demo_db, DemoSpec};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let db = std::path::PathBuf::from(
        args.get(1)
            .map(String::as_str)
            .unwrap_or("/tmp/draftlens-demo.sqlite"),
    );
    let size = args.get(2).map(String::as_str).unwrap_or("showcase");
    let addr = args.get(3).map(String::as_str).unwrap_or("127.0.0.1:8080");
    if !db.exists() {
        let spec = match size {
            "small" => DemoSpec::small(),
            "bench" => DemoSpec::bench(),
            _ => DemoSpec::showcase(),
        };
        let t = std::time::Instant::now();
        fill_demo_db(&Store::open(&db)?, &spec)?;
        eprintln!(
            "filled {} in {:.1} s",
            db.display(),
            t.elapsed().as_secs_f64()
        );
    }
    let opts = draftlens_web::ServeOptions {
        db,
        addr: addr.parse()?,
        ..Default::default()
    };
    tokio::runtime::Runtime::new()?.block_on(draftlens_web::serve(opts))
}
