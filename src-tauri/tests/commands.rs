//! The app's commands on Tauri's mock runtime, backed by a real in-process server with the
//! default model: status reports the server, pausing turns generation away with 503.
use std::sync::Arc;

use mlxbar::{Config, Server};
use mlxbar_app::ServerSlot;
use serde_json::{json, Value};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{get_ipc_response, mock_builder, MockRuntime, INVOKE_KEY};
use tauri::webview::InvokeRequest;
use tauri::{WebviewWindow, WebviewWindowBuilder};

fn invoke(w: &WebviewWindow<MockRuntime>, origin: &str, cmd: &str, args: Value) -> Result<Value, Value> {
    let req = InvokeRequest {
        cmd: cmd.into(),
        callback: CallbackFn(0),
        error: CallbackFn(1),
        url: origin.parse().unwrap(),
        body: InvokeBody::Json(args),
        headers: Default::default(),
        invoke_key: INVOKE_KEY.to_string(),
    };
    get_ipc_response(w, req).map(|b| b.deserialize::<Value>().unwrap())
}

/// Where the popover page comes from: the in-process server.
const PAGE: &str = "http://127.0.0.1:8080/";

#[test]
fn status_and_pause_commands_drive_the_real_server() {
    let model = mlxbar::model_store::ensure_default_model().expect("default model");
    let config = Config { port: 0, model: Some(model), ..Config::default() };
    let slot = Arc::new(ServerSlot::default());
    // The app's real config and capabilities (tauri.conf.json, capabilities/).
    let app = mlxbar_app::builder(mock_builder(), slot.clone()).build(tauri::generate_context!(test = true)).unwrap();
    let w = WebviewWindowBuilder::new(&app, "popover", Default::default()).build().unwrap();

    let starting = invoke(&w, PAGE, "app_status", json!({})).unwrap();
    assert_eq!(starting["phase"], "starting");
    assert!(invoke(&w, PAGE, "set_serving", json!({"serving": false})).unwrap_err().as_str().unwrap().contains("not running"));

    let server = tauri::async_runtime::block_on(async {
        let s = Server::start(config).await.unwrap();
        s.wait_ready().await.unwrap();
        s
    });
    let url = server.url();
    slot.set_running(server);
    let status = invoke(&w, PAGE, "app_status", json!({})).unwrap();
    assert_eq!(status["phase"], "running");
    assert_eq!(status["server"]["url"], url);
    assert_eq!(status["server"]["state"]["state"], "ready");
    assert_eq!(status["server"]["paused"], false);

    let paused = invoke(&w, PAGE, "set_serving", json!({"serving": false})).unwrap();
    assert_eq!(paused["server"]["paused"], true);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let post = |body: &Value| {
        tauri::async_runtime::block_on(async { reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(body).send().await.unwrap().status().as_u16() })
    };
    assert_eq!(post(&chat), 503);
    assert!(invoke(&w, PAGE, "set_serving", json!({})).is_err(), "missing argument is an error");
    let resumed = invoke(&w, PAGE, "set_serving", json!({"serving": true})).unwrap();
    assert_eq!(resumed["server"]["paused"], false);
    assert_eq!(post(&chat), 200);

    // Pages from anywhere else get no commands (capabilities/popover.json).
    let refused = invoke(&w, "https://evil.example/", "set_serving", json!({"serving": false})).unwrap_err();
    assert!(refused.as_str().unwrap().contains("not allowed"), "{refused}");
    assert_eq!(invoke(&w, PAGE, "app_status", json!({})).unwrap()["server"]["paused"], false);

    tauri::async_runtime::block_on(slot.stop());
    assert_eq!(invoke(&w, PAGE, "app_status", json!({})).unwrap()["phase"], "stopped");
}
