import { defineConfig } from 'vite';
import react from '@vitejs/plugin-react';

// The page is static: serve.mjs serves dist/ with the dashboards and a
// proxy to the Prometheus given at run time.
export default defineConfig({
  plugins: [react()],
  // Some dependencies still name Node's global.
  define: { global: 'globalThis' },
  base: './',
  build: { outDir: 'dist', emptyOutDir: true, chunkSizeWarningLimit: 10000 },
});
