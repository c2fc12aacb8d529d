// localrun's web app: asks for the key when the server has one, then shows the chat and the Models view.
import { apiKey, keyState, setApiKey, toast } from "./api.js";
import { refreshModels, setupChat } from "./chat.js";
import { setupMachine, watch } from "./machine.js";

const $ = (id) => document.getElementById(id);

function showView(name) {
  const chat = name === "chat";
  $("view-chat").hidden = !chat;
  $("view-machine").hidden = chat;
  $("tab-chat").setAttribute("aria-pressed", String(chat));
  $("tab-machine").setAttribute("aria-pressed", String(!chat));
  $("menu").hidden = !chat;
  watch(!chat);
}

let started = false;

async function start() {
  $("keygate").hidden = true;
  $("app").hidden = false;
  if (started) {
    if (!$("view-machine").hidden) watch(true);
    return refreshModels().catch((err) => toast("Could not list models: " + err.message));
  }
  started = true;
  setupChat();
  setupMachine(() => refreshModels().catch((err) => toast("Could not list models: " + err.message)));
  $("tab-chat").addEventListener("click", () => showView("chat"));
  $("tab-machine").addEventListener("click", () => showView("machine"));
  $("menu").addEventListener("click", () => {
    const open = $("sidebar").classList.toggle("open");
    $("menu").setAttribute("aria-expanded", String(open));
  });
  try {
    await refreshModels();
  } catch (err) {
    toast("Could not list models: " + err.message);
  }
  document.body.dataset.ready = "true";
}

function askForKey(message) {
  $("app").hidden = true;
  $("keygate").hidden = false;
  $("keyerror").textContent = message;
  $("keyinput").focus();
}

async function boot() {
  $("keyform").addEventListener("submit", async (e) => {
    e.preventDefault();
    setApiKey($("keyinput").value.trim());
    $("keyinput").value = "";
    if ((await keyState()) === "open") await start();
    else {
      setApiKey("");
      askForKey("That key is not valid.");
    }
  });
  // The server refused the key we hold (it changed, or the server restarted with another): ask again.
  document.addEventListener("localrun:unauthorized", () => {
    watch(false);
    setApiKey("");
    askForKey("The server refused the key: type it again.");
  });
  let state;
  try {
    state = await keyState();
  } catch (err) {
    $("conn").textContent = "server unreachable: " + err.message;
    return;
  }
  if (state === "open") await start();
  else askForKey(apiKey() ? "That key is not valid." : "");
}

boot();
