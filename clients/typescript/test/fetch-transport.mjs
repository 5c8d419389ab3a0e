// Preloaded (`node --import ./test/fetch-transport.mjs --test ...`) to run the suites with every
// client on `fetch`, the transport of browsers, workers and edge functions.
import { Client } from '../dist/index.js';

Client.defaultTransport = 'fetch';
