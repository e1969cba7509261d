// The first module of a built component (the build's entry imports it before the app):
// binds the host's interface and routes `console` to the plugin log. Not importable
// natively: `maporl:plugin/host@0.2.0` exists only inside a component.
import * as host from "maporl:plugin/host@0.2.0";
import { install } from "./host.js";

install(host);
