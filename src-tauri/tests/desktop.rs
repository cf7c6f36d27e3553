//! The real app binary on a real (virtual) desktop: Xvfb, a private D-Bus session with the
//! dunst notification daemon, and trayer as the XEmbed tray host. The tray menu opens the
//! popover (screenshot in test-artifacts/), a forced alert becomes a native notification
//! that dunst records, the in-process server answers, the menu starts a benchmark whose end
//! is notified too, "Reload model" brings a fresh engine up (notified), "Pause serving"
//! turns requests away with 503 until resumed, the "Model" submenu lists the library's
//! models, loads one (notified when ready, then checked with its memory) and unloads it,
//! "Launch at login" writes and removes the XDG autostart entry, the Ollama port item closes
//! and reopens Ollama's address, and Quit from the menu
//! ends the app.
//!
//! Needs `cargo build --release -p mlxbar-app` first and Debian's xvfb, dbus, dunst,
//! trayer, xdotool and imagemagick (scripts/test.sh installs them).
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Children killed when the test ends, however it ends.
struct Procs(Vec<(&'static str, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Desktop {
    display: String,
    bus: String,
    procs: Procs,
}

impl Desktop {
    fn start() -> Desktop {
        let mut procs = Procs(vec![]);
        let n = (100..400)
            .find(|n| !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists() && !Path::new(&format!("/tmp/.X{n}-lock")).exists())
            .unwrap();
        let display = format!(":{n}");
        let xvfb = Command::new("Xvfb")
            .args([&display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"])
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb (apt install xvfb)");
        procs.0.push(("Xvfb", xvfb));
        wait_for("Xvfb", Duration::from_secs(10), || Path::new(&format!("/tmp/.X11-unix/X{n}")).exists().then_some(()));

        let mut dbus = Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--print-address"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("dbus-daemon");
        let mut line = String::new();
        BufReader::new(dbus.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let bus = line.trim().to_string();
        procs.0.push(("dbus-daemon", dbus));

        let mut d = Desktop { display, bus, procs };
        let dunst = d.command("dunst").stderr(Stdio::null()).spawn().expect("dunst");
        d.procs.0.push(("dunst", dunst));
        wait_for("dunst on the bus", Duration::from_secs(10), || d.output("dunstctl", &["is-paused"]).filter(|o| o.trim() == "false"));
        let trayer = d
            .command("trayer")
            .args([
                "--edge",
                "top",
                "--align",
                "right",
                "--widthtype",
                "request",
                "--height",
                "28",
                "--SetDockType",
                "true",
                "--transparent",
                "false",
                "--tint",
                "0xe8e8ed",
            ])
            .stderr(Stdio::null())
            .spawn()
            .expect("trayer");
        d.procs.0.push(("trayer", trayer));
        d
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("DISPLAY", &self.display).env("DBUS_SESSION_BUS_ADDRESS", &self.bus).env("NO_AT_BRIDGE", "1");
        c
    }

    fn output(&self, program: &str, args: &[&str]) -> Option<String> {
        let out = self.command(program).args(args).stderr(Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn xdotool(&self, args: &[&str]) -> Option<String> {
        self.output("xdotool", args)
    }

    /// (x, y, width, height) of a window.
    fn geometry(&self, window: &str) -> (i32, i32, i32, i32) {
        let out = self.xdotool(&["getwindowgeometry", "--shell", window]).expect("window geometry");
        let get = |k: &str| out.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap().parse::<i32>().unwrap();
        (get("X"), get("Y"), get("WIDTH"), get("HEIGHT"))
    }

    /// Clicks the app's icon in the tray and picks a menu item with the keyboard.
    fn tray_menu(&self, keys: &[&str]) {
        // trayer's panel is the window named "panel"; it grows to fit the icons it holds.
        let (x, y, w, h) = wait_for("an icon in the tray", Duration::from_secs(20), || {
            let panel = self.xdotool(&["search", "--name", "^panel$"])?.lines().next()?.to_owned();
            let g = self.geometry(&panel);
            (g.2 >= 16).then_some(g)
        });
        // The app's icon is the only one: the middle of the tray.
        let (cx, cy) = ((x + w / 2).to_string(), (y + h / 2).to_string());
        self.xdotool(&["mousemove", &cx, &cy, "click", "1"]).unwrap();
        wait_for("the tray menu", Duration::from_secs(10), || {
            self.xdotool(&["search", "--onlyvisible", "--maxdepth", "1", "--class", "mlxbar-app"]).filter(|o| !o.trim().is_empty())
        });
        for k in keys {
            self.xdotool(&["key", "--delay", "80", k]).unwrap();
        }
    }

    fn screenshot(&self, window: &str, path: &Path) {
        let ok = self.command("import").args(["-window", window, path.to_str().unwrap()]).status().unwrap().success();
        assert!(ok, "screenshot {}", path.display());
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn get(url: &str) -> Option<String> {
    let out = Command::new("curl").args(["-sf", "--max-time", "5", url]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_app_serves_shows_the_popover_from_the_tray_notifies_and_quits() {
    let bin = root().join("target/release/mlxbar-app");
    assert!(bin.exists(), "build the app first: cargo build --release -p mlxbar-app");
    let artifacts = root().join("test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let mut desk = Desktop::start();

    let dir = tempfile_dir();
    config_errors_are_notified(&desk, &bin, &dir, &artifacts);
    let config = dir.join("config.toml");
    // A second model for the Model submenu: another path to the default GGUF (a hard link:
    // the library counts a symlink to the same file once).
    let cache = std::env::var_os("MLXBAR_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/mlxbar"));
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let second_path = models.join(format!("{SECOND}.gguf"));
    if !second_path.exists() {
        let gguf = cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if std::fs::hard_link(&gguf, &second_path).is_err() {
            std::fs::copy(&gguf, &second_path).unwrap(); // another file system
        }
    }
    // An alert that fires on the first request: the notification path end to end. The
    // Ollama port on a free port, not 11434 (an Ollama may run here).
    let ollama_port = free_port();
    std::fs::write(
        &config,
        format!(
            "models_dirs = [{:?}]\nollama_port = {ollama_port}\n[alerts.ttft_p90_high]\nthreshold = 0.001\nfor_seconds = 0\n",
            models.to_str().unwrap()
        ),
    )
    .unwrap();
    // A user plan named "quick" replaces the built-in one, so the tray's run ends in seconds.
    let plans = dir.join("metrics/bench/plans");
    std::fs::create_dir_all(&plans).unwrap();
    std::fs::write(
        plans.join("quick.json"),
        r#"{"name": "quick", "concurrency": [1], "prompt_tokens": [16], "output_tokens": [4], "repetitions": 1, "warmup": 0}"#,
    )
    .unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(artifacts.join("app-desktop.log")).unwrap();
    let app = desk
        .command(bin.to_str().unwrap())
        .args(["--config", config.to_str().unwrap(), "--port", &port.to_string()])
        .env("XDG_RUNTIME_DIR", &dir)
        .env("MLXBAR_DATA_DIR", &dir)
        // HOME in the temp dir: the autostart entry lands there, and the library holds only
        // the default model (found through the cache dir) and the second one.
        .env("HOME", &dir)
        .env("MLXBAR_CACHE_DIR", &cache)
        // The model submenu logs what it lists (the menu itself cannot be read back).
        .env("MLXBAR_LOG", "info,mlxbar_app::model_menu=debug")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    desk.procs.0.push(("mlxbar-app", app));

    // The in-process server answers and loads the model.
    wait_for("the in-process server", Duration::from_secs(120), || get(&format!("{base}/health")).filter(|h| h.contains("\"ok\"")));

    // A request makes the forced alert fire; dunst receives the notification.
    let chat = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3}"#;
    let out = Command::new("curl")
        .args(["-sf", &format!("{base}/v1/chat/completions"), "-H", "Content-Type: application/json", "-d", chat])
        .output()
        .unwrap();
    assert!(out.status.success(), "chat request failed");
    let history = wait_for("the notification in dunst", Duration::from_secs(15), || {
        desk.output("dunstctl", &["history"]).filter(|h| h.contains("Time to first token p90"))
    });
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    let note = &history["data"][0]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["summary"]["data"].as_str().unwrap_or("").contains("Time to first token"))
        .unwrap();
    assert_eq!(note["appname"]["data"], "mlxbar-app", "sent by the app (notify-rust names the executable)");
    assert!(note["body"]["data"].as_str().unwrap().starts_with("Now "), "{note}");

    // Tray menu → "Show mlxbar" (the first item) opens the popover, which connects to the
    // live stream.
    desk.tray_menu(&["Down", "Return"]);
    let popover = wait_for("the popover window", Duration::from_secs(15), || {
        desk.xdotool(&["search", "--onlyvisible", "--name", "^mlxbar$"]).and_then(|o| o.lines().next().map(str::to_owned))
    });
    wait_for("the popover's live stream", Duration::from_secs(20), || {
        get(&format!("{base}/metrics"))
            .filter(|m| m.contains("mlxbar_http_requests_in_flight{method=\"GET\",route=\"/api/metrics/stream\"} 1"))
    });
    let (_, _, w, h) = desk.geometry(&popover);
    assert!((360..=400).contains(&w) && h >= 600, "popover is {w}x{h}");
    // The page renders from the first snapshot: the status dot (top left) turns from grey
    // to the "serving" green (#30b158) once WebKit has painted it.
    let shot = artifacts.join("app-popover.png");
    wait_for("a popover painted in the serving state", Duration::from_secs(15), || {
        desk.screenshot(&popover, &shot);
        let colours = Command::new("convert")
            .args([shot.to_str().unwrap(), "-crop", "40x50+0+0", "+repage", "-unique-colors", "txt:-"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&colours.stdout).contains("#30B158").then_some(())
    });
    desk.screenshot("root", &artifacts.join("app-desktop.png"));

    // Tray menu → "Run quick benchmark" (fifth item: Show, Model, dashboard, metrics URL,
    // bench) starts the quick profile in the in-process server.
    desk.tray_menu(&["Down", "Down", "Down", "Down", "Down", "Return"]);
    let jobs = wait_for("the benchmark to start", Duration::from_secs(15), || {
        get(&format!("{base}/api/bench")).filter(|j| j.contains("\"profile\":\"quick\""))
    });
    let jobs: serde_json::Value = serde_json::from_str(&jobs).unwrap();
    assert_eq!(jobs["data"][0]["profile"], "quick", "{jobs}");
    // When it ends, a notification says how it went.
    let history = wait_for("the benchmark's notification in dunst", Duration::from_secs(60), || {
        desk.output("dunstctl", &["history"]).filter(|h| h.contains("Benchmark finished"))
    });
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    let note = history["data"][0].as_array().unwrap().iter().find(|n| n["summary"]["data"] == "Benchmark finished").unwrap().clone();
    let body = note["body"]["data"].as_str().unwrap();
    assert!(body.starts_with("quick: 1×16→4: ") && body.contains(" tok/s, TTFT "), "{body}");

    // Tray menu → "Reload model" (seventh item) loads the model on a fresh engine thread;
    // a notification says it serves again, and it does.
    desk.tray_menu(&["Down", "Down", "Down", "Down", "Down", "Down", "Down", "Return"]);
    wait_for("the reload's notification in dunst", Duration::from_secs(60), || {
        desk.output("dunstctl", &["history"]).filter(|h| h.contains("Model reloaded"))
    });
    wait_for("the reloaded server", Duration::from_secs(30), || get(&format!("{base}/health")).filter(|h| h.contains("\"ok\"")));
    let out = Command::new("curl")
        .args(["-sf", &format!("{base}/v1/chat/completions"), "-H", "Content-Type: application/json", "-d", chat])
        .output()
        .unwrap();
    assert!(out.status.success(), "chat request after the reload failed");

    // Tray menu → "Pause serving" (fifth from the bottom: Quit, Launch at login, the Ollama
    // port, Reload, Pause; counted from there because the benchmark item above it is
    // disabled while paused) turns generation away with 503;
    // the same item, now "Resume serving", lets it through again.
    let chat_status = || {
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("{base}/v1/chat/completions"),
                "-H",
                "Content-Type: application/json",
                "-d",
                chat,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let paused = |want: bool| get(&format!("{base}/api/metrics/snapshot")).filter(|s| s.contains(&format!("\"paused\":{want}")));
    desk.tray_menu(&["Up", "Up", "Up", "Up", "Up", "Return"]);
    wait_for("the server to pause", Duration::from_secs(10), || paused(true));
    assert_eq!(chat_status(), "503", "a chat request while paused");
    desk.tray_menu(&["Up", "Up", "Up", "Up", "Up", "Return"]);
    wait_for("the server to resume", Duration::from_secs(10), || paused(false));
    assert_eq!(chat_status(), "200", "a chat request after resuming");

    models_from_the_menu(&desk, &base, &artifacts);

    // "Answer Ollama clients on Ollama's port" (third from the bottom): on from the config,
    // so Ollama's routes answer there; clicked, the port closes; clicked again, it serves.
    let ollama_version = || get(&format!("http://127.0.0.1:{ollama_port}/api/version"));
    wait_for("the Ollama port from the config", Duration::from_secs(10), || ollama_version().filter(|v| v.contains("version")));
    desk.tray_menu(&["Up", "Up", "Up", "Return"]);
    wait_for("the Ollama port to close", Duration::from_secs(10), || ollama_version().is_none().then_some(()));
    desk.tray_menu(&["Up", "Up", "Up", "Return"]);
    wait_for("the Ollama port to serve again", Duration::from_secs(10), || ollama_version().filter(|v| v.contains("version")));

    // "Launch at login" (second from the bottom; off at first) writes the XDG autostart
    // entry that starts this binary; clicked again, it removes it.
    let entry = dir.join(".config/autostart/mlxbar.desktop");
    assert!(!entry.exists(), "launch at login is off by default");
    desk.tray_menu(&["Up", "Up", "Return"]);
    let desktop_file = wait_for("the autostart entry", Duration::from_secs(10), || std::fs::read_to_string(&entry).ok());
    assert!(desktop_file.contains(&format!("Exec={}", bin.display())), "{desktop_file}");
    desk.tray_menu(&["Up", "Up", "Return"]);
    wait_for("the autostart entry to go", Duration::from_secs(10), || (!entry.exists()).then_some(()));

    // Quit (the last item) stops the server and ends the process.
    desk.tray_menu(&["Up", "Return"]);
    let (_, app) = desk.procs.0.iter_mut().find(|(n, _)| *n == "mlxbar-app").unwrap();
    let status = wait_for("the app to exit", Duration::from_secs(20), || app.try_wait().unwrap());
    assert!(status.success(), "app exited with {status}");
    assert!(get(&format!("{base}/health")).is_none(), "the server still answers after Quit");
}

/// The second model's id: the file stem of its path under `models_dirs`.
const SECOND: &str = "smollm2-second";

fn library(base: &str) -> serde_json::Value {
    serde_json::from_str(&get(&format!("{base}/api/models")).expect("GET /api/models")).unwrap()
}

fn state_of(base: &str, id: &str) -> String {
    let lib = library(base);
    let m = lib["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap_or_else(|| panic!("{id} not in {lib}"));
    m["state"].as_str().unwrap().to_string()
}

/// The "Model" submenu (second item): it lists the runnable models in id order, loaded
/// ones checked with their memory; choosing the second model loads it (a notification
/// says so) and its "Unload" item unloads it.
fn models_from_the_menu(desk: &Desktop, base: &str, artifacts: &Path) {
    let log = || std::fs::read_to_string(artifacts.join("app-desktop.log")).unwrap_or_default();
    let lib = library(base);
    let mut ids: Vec<String> =
        lib["models"].as_array().unwrap().iter().filter(|m| m["runnable"] == true).map(|m| m["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    let default = lib["default"].as_str().unwrap().to_string();
    assert!(ids.contains(&SECOND.to_string()) && ids.contains(&default), "runnable models: {ids:?}");
    assert_eq!(state_of(base, SECOND), "unloaded");
    // What the submenu lists now: both models, the default checked with its memory.
    wait_for("the model submenu to list both models", Duration::from_secs(15), || {
        log()
            .lines()
            .rev()
            .find(|l| l.contains("tray model menu"))
            .filter(|l| l.contains(SECOND) && l.contains(&format!("\"{default} — ")))
            .map(|_| ())
    });

    // Open it (Right) to look at it, then close the menu. The submenu is one more of the
    // app's visible windows.
    let windows =
        || desk.xdotool(&["search", "--onlyvisible", "--maxdepth", "1", "--class", "mlxbar-app"]).map_or(0, |o| o.lines().count());
    desk.tray_menu(&["Down", "Down"]);
    let before = windows();
    desk.xdotool(&["key", "Right"]).unwrap();
    wait_for("the submenu to open", Duration::from_secs(10), || (windows() > before).then_some(()));
    desk.screenshot("root", &artifacts.join("app-model-menu.png"));
    desk.xdotool(&["key", "Escape", "Escape"]).unwrap();

    // Choose the second model: Right selects the submenu's first item, then Down to it.
    let at = ids.iter().position(|i| i == SECOND).unwrap();
    let mut keys = vec!["Down", "Down", "Right"];
    keys.extend(std::iter::repeat_n("Down", at));
    keys.push("Return");
    desk.tray_menu(&keys);
    wait_for("the model-ready notification in dunst", Duration::from_secs(60), || {
        desk.output("dunstctl", &["history"]).filter(|h| h.contains("Model ready") && h.contains(SECOND))
    });
    assert_eq!(state_of(base, SECOND), "loaded");
    assert_eq!(state_of(base, &default), "loaded", "the default stays loaded beside it");
    // The menu now checks it, with its memory, and offers to unload it.
    let line = wait_for("the submenu to show it loaded", Duration::from_secs(10), || {
        log().lines().rev().find(|l| l.contains("tray model menu")).filter(|l| l.contains(&format!("\"{SECOND} — "))).map(str::to_owned)
    });
    assert!(line.contains(" MB\"") || line.contains(" KB\"") || line.contains(" GB\""), "{line}");

    // "Unload <id>": after the model lines, the unload items in the same order.
    let loaded: Vec<&String> = ids.iter().filter(|i| **i == default || *i == SECOND).collect();
    let unload_at = ids.len() + loaded.iter().position(|i| *i == SECOND).unwrap();
    let mut keys = vec!["Down", "Down", "Right"];
    keys.extend(std::iter::repeat_n("Down", unload_at));
    keys.push("Return");
    desk.tray_menu(&keys);
    wait_for("the second model to unload", Duration::from_secs(20), || (state_of(base, SECOND) == "unloaded").then_some(()));
    assert_eq!(state_of(base, &default), "loaded");
}

/// A config.toml that does not load: the app says why, with the line, in a notification
/// (a menu-bar app has no terminal), and exits with 2.
fn config_errors_are_notified(desk: &Desktop, bin: &Path, dir: &Path, artifacts: &Path) {
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "port = 8080\nmax_batch = \"eight\"\n").unwrap();
    // Nothing else on screen: the one displayed next is the app's.
    desk.output("dunstctl", &["close-all"]);
    let mut app = desk
        .command(bin.to_str().unwrap())
        .args(["--config", broken.to_str().unwrap()])
        .env("XDG_RUNTIME_DIR", dir)
        .env("HOME", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for("the app to exit on a broken config", Duration::from_secs(20), || app.try_wait().unwrap());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut app.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
    // It stays until dismissed (dunst keeps it out of its history while it is shown).
    wait_for("the config error's notification on screen", Duration::from_secs(15), || {
        desk.output("dunstctl", &["count", "displayed"]).filter(|n| n.trim() != "0")
    });
    desk.screenshot("root", &artifacts.join("config-error-notification.png"));
    desk.output("dunstctl", &["close-all"]);
    let history = wait_for("the config error's notification in dunst's history", Duration::from_secs(15), || {
        desk.output("dunstctl", &["history"]).filter(|h| h.contains("the configuration has an error"))
    });
    assert!(history.contains("broken.toml, line 2, column 13") && history.contains("expected usize"), "{history}");
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxbar-desktop-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    d
}
