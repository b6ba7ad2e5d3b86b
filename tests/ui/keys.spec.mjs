// Managed upstream keys in headless Chromium (issue 19): an admin adds a key on the
// Upstreams page, sees only its last four characters, adds a model routed to it with its
// prices, and the next request through the official OpenAI Python SDK goes out with that
// key (the mock counts requests per key). Started by run.sh, which provides the env.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chromium } from "playwright-core";

const BASE = process.env.BASE_URL;
const MOCK = process.env.MOCK_URL;
const KEY = "sk-ui-managed-key-3f8d9Lm3";
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

function sdkChat(token, model) {
  const script = `
import json, os
from openai import OpenAI, APIStatusError
c = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"], max_retries=0, timeout=10)
try:
    r = c.chat.completions.create(model=os.environ["MODEL"], max_tokens=16, messages=[{"role": "user", "content": "hello"}])
    print(json.dumps({"ok": True, "status": 200}))
except APIStatusError as e:
    print(json.dumps({"ok": False, "status": e.status_code, "text": str(e)}))
`;
  const out = execFileSync("python3", ["-c", script], { env: { ...process.env, BASE, TOKEN: token, MODEL: model } });
  return JSON.parse(out.toString());
}

async function used(key) {
  const stats = await (await fetch(`${MOCK}/_mock/stats`)).json();
  return stats.keys[key]?.count ?? 0;
}

test("an admin adds a key in the UI and the next SDK request goes through it", async () => {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ARGS });
  try {
    const page = await (await browser.newContext()).newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`${BASE}/admin/login`);
    await page.getByLabel("Username").fill("admin");
    await page.getByLabel("Password").fill(process.env.ADMIN_PASSWORD);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForURL(`${BASE}/admin/`);

    await page.goto(`${BASE}/admin/upstreams`);
    const add = page.locator("form[hx-post='/admin/upstreams']");
    await add.getByLabel("Id", { exact: true }).fill("ui-key");
    await add.getByLabel("Provider").selectOption("openai");
    await add.getByLabel("Base URL").fill(`${MOCK}/v1`);
    await add.getByLabel("Key", { exact: true }).fill(KEY);
    await add.getByLabel("Private network").check();
    await add.getByRole("button", { name: "Add key" }).click();
    await page.locator("#flash").getByText("Upstream ui-key added.").waitFor();
    const row = page.locator("#upstreams tr", { hasText: "ui-key" });
    assert.match(await row.innerText(), /\*\*\*\*9Lm3/);
    assert.match(await row.innerText(), /added here/);
    assert.ok(!(await page.content()).includes(KEY), "the whole key is on the page");

    const model = page.locator("form[hx-post='/admin/models']");
    await model.getByLabel("Name").fill("ui-model");
    await model.getByLabel("Upstream", { exact: true }).fill("ui-key");
    await model.getByLabel("Upstream model").fill("ui-model-upstream");
    await model.getByLabel("Input USD per 1M tokens").fill("1");
    await model.getByLabel("Output USD per 1M tokens").fill("2");
    await model.getByRole("button", { name: "Save model" }).click();
    await page.locator("#flash").getByText("Model ui-model saved.").waitFor();
    assert.match(await page.locator("#models tr", { hasText: "ui-model" }).innerText(), /ui-key → ui-model-upstream/);

    // Reloaded, the page still shows the last four only.
    await page.goto(`${BASE}/admin/upstreams`);
    assert.ok(!(await page.content()).includes(KEY), "the whole key is on the page after a reload");

    const token = JSON.parse(execFileSync(process.env.SLUICE_BIN, ["--config", process.env.SLUICE_CONFIG_FILE, "token", "issue", "--user", "keys-ui", "--budget-usd", "5", "--json"]).toString()).token;
    const before = await used(KEY);
    const r = sdkChat(token, "ui-model");
    assert.deepEqual(r, { ok: true, status: 200 });
    assert.equal(await used(KEY), before + 1, "the request did not go out with the key added in the UI");
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
  }
});
